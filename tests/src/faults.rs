//! A mock for what a real API server cannot show on cue: scripted error answers (409, 429, 500,
//! 503, …) to the next N matching requests, watches cut mid-stream, and watches that resume into
//! `410 Gone` (their history compacted away). A tower layer in front of a real kube client's HTTP
//! service (`ClientBuilder::with_layer`): every request it does not answer itself goes to the
//! real kube-apiserver unchanged.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, Full, StreamBody};
use kube::client::{Body, ClientBuilder, DynBody};
use tower::{BoxError, Layer, Service};

/// One armed failure: the next `count` requests of `verb` on `resource` get `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    verb: String,
    /// Plural resource with its subresource (`persistentpodstates/status`); `None`: any.
    resource: Option<String>,
    count: usize,
    code: u16,
    retry_after: Option<u64>,
    /// A watch answered `200` with one `ERROR` event, as kube-apiserver answers a watch from
    /// a compacted resourceVersion.
    in_stream: bool,
}

impl Fault {
    /// `count` requests of `verb` (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`) on `resource` fail with `code`.
    pub fn new(verb: &str, resource: &str, count: usize, code: u16) -> Fault {
        Fault {
            verb: verb.to_string(),
            resource: Some(resource.to_string()),
            count,
            code,
            retry_after: None,
            in_stream: false,
        }
    }

    /// With a `Retry-After` header.
    pub fn retry_after(mut self, seconds: u64) -> Fault {
        self.retry_after = Some(seconds);
        self
    }
}

/// The faults armed for one client (clone it: every clone arms the same).
#[derive(Debug, Clone, Default)]
pub struct Faults(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    armed: Mutex<Vec<Fault>>,
    /// Bumped by [`Faults::drop_watches`]; open watches end when it changes.
    cuts: tokio::sync::watch::Sender<u64>,
    open_watches: AtomicUsize,
}

impl Faults {
    /// Arms `fault`.
    pub fn inject(&self, fault: Fault) {
        self.lock().push(fault);
    }

    /// How many armed failures have not happened yet.
    pub fn pending(&self) -> usize {
        self.lock().iter().map(|f| f.count).sum()
    }

    /// Ends every open watch (the connection closes cleanly, as when kube-apiserver restarts
    /// or a load balancer drops it).
    pub fn drop_watches(&self) {
        self.0.cuts.send_modify(|n| *n += 1);
    }

    /// The history behind every open watch is gone: as many next watches as are open now get
    /// an `ERROR` event with `410 Gone` (`Expired`), as after etcd compacted their
    /// resourceVersion, and must relist.
    pub fn expire_watches(&self) {
        let open = self.0.open_watches.load(Ordering::Acquire);
        self.lock().push(Fault {
            verb: "watch".into(),
            resource: None,
            count: open,
            code: 410,
            retry_after: None,
            in_stream: true,
        });
    }

    /// A client for `config` with these faults in front of its HTTP service.
    pub fn client(&self, config: kube::Config) -> kube::Client {
        ClientBuilder::try_from(config)
            .expect("kube client")
            .with_layer(self)
            .build()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        self.0.armed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer of an armed fault matching this request, if any (counting it).
    fn take(&self, verb: &str, resource: &str) -> Option<Response<Box<DynBody>>> {
        let mut armed = self.lock();
        let fault = armed.iter_mut().find(|f| {
            f.count > 0 && f.verb == verb && f.resource.as_deref().is_none_or(|r| r == resource)
        })?;
        fault.count -= 1;
        let fault = fault.clone();
        armed.retain(|f| f.count > 0);
        Some(answer(&fault, resource))
    }
}

fn answer(fault: &Fault, resource: &str) -> Response<Box<DynBody>> {
    let (reason, message) = match fault.code {
        409 => (
            "Conflict",
            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again",
        ),
        410 => ("Expired", "too old resource version"),
        429 => (
            "TooManyRequests",
            "too many requests, please try again later",
        ),
        503 => (
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ),
        _ => ("InternalError", "Internal error occurred: injected"),
    };
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": format!("{message} ({resource})"), "reason": reason,
        "code": fault.code});
    let (code, text) = if fault.in_stream {
        (
            200,
            format!(
                "{}\n",
                serde_json::json!({"type": "ERROR", "object": status})
            ),
        )
    } else {
        (fault.code, status.to_string())
    };
    let mut response = Response::builder()
        .status(StatusCode::from_u16(code).expect("an HTTP status"))
        .header("content-type", "application/json");
    if let Some(seconds) = fault.retry_after {
        response = response.header("retry-after", seconds.to_string());
    }
    response
        .body(boxed(Full::new(Bytes::from(text)).map_err(|e| match e {})))
        .expect("a response")
}

fn boxed<B>(body: B) -> Box<DynBody>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    Box::new(body.map_err(Into::into))
}

/// The verb and `resource[/subresource]` of a request to the API, as RBAC names them.
fn classify<B>(req: &Request<B>) -> (&'static str, String) {
    let segments: Vec<&str> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    }
    .unwrap_or_default();
    let rest = match rest {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let resource = match rest {
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
        [resource, ..] => (*resource).to_string(),
        [] => String::new(),
    };
    let watch = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match *req.method() {
        Method::GET if watch => "watch",
        Method::GET if rest.len() == 1 => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if rest.len() == 1 => "deletecollection",
        Method::DELETE => "delete",
        _ => "other",
    };
    (verb, resource)
}

impl<S> Layer<S> for Faults {
    type Service = FaultService<S>;

    fn layer(&self, inner: S) -> FaultService<S> {
        FaultService {
            inner,
            faults: self.clone(),
        }
    }
}

/// The service [`Faults`] puts in front of a client's.
#[derive(Debug, Clone)]
pub struct FaultService<S> {
    inner: S,
    faults: Faults,
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<Box<DynBody>>, BoxError>> + Send>>;

impl<S> Service<Request<Body>> for FaultService<S>
where
    S: Service<Request<Body>, Response = Response<Box<DynBody>>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> ResponseFuture {
        let (verb, resource) = classify(&req);
        if let Some(answer) = self.faults.take(verb, &resource) {
            return Box::pin(async move { Ok(answer) });
        }
        let response = self.inner.call(req);
        if verb != "watch" {
            return Box::pin(response);
        }
        let faults = self.faults.clone();
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| cuttable(body, &faults)))
        })
    }
}

/// A watch's body that ends when [`Faults::drop_watches`] is called.
fn cuttable(body: Box<DynBody>, faults: &Faults) -> Box<DynBody> {
    let mut cuts = faults.0.cuts.subscribe();
    let open = OpenWatch::new(faults);
    let cut = async move {
        let _open = open;
        let _ = cuts.changed().await;
    };
    let frames = BodyStream::new(body).take_until(cut);
    boxed(StreamBody::new(Box::pin(frames)))
}

/// Counts a watch as open while it lives.
struct OpenWatch(Faults);

impl OpenWatch {
    fn new(faults: &Faults) -> OpenWatch {
        faults.0.open_watches.fetch_add(1, Ordering::AcqRel);
        OpenWatch(faults.clone())
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.0.open_watches.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verb_and_resource(method: Method, uri: &str) -> (&'static str, String) {
        classify(
            &Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .expect("a valid request"),
        )
    }

    #[test]
    fn requests_are_named_as_rbac_names_them() {
        let cases = [
            (
                Method::GET,
                "/api/v1/pods?watch=true&resourceVersion=5",
                "watch",
                "pods",
            ),
            (Method::GET, "/api/v1/namespaces/db/pods", "list", "pods"),
            (Method::GET, "/api/v1/namespaces/db/pods/p", "get", "pods"),
            (Method::GET, "/api/v1/namespaces/db", "get", "namespaces"),
            (Method::GET, "/api/v1/namespaces", "list", "namespaces"),
            (
                Method::PATCH,
                "/apis/ipkeep.dev/v1alpha1/namespaces/db/persistentpodstates/x/status",
                "patch",
                "persistentpodstates/status",
            ),
            (
                Method::POST,
                "/apis/apps/v1/namespaces/db/statefulsets",
                "create",
                "statefulsets",
            ),
            (Method::DELETE, "/api/v1/nodes/n1", "delete", "nodes"),
        ];
        for (method, uri, verb, resource) in cases {
            assert_eq!(
                verb_and_resource(method, uri),
                (verb, resource.to_string()),
                "{uri}"
            );
        }
    }
}

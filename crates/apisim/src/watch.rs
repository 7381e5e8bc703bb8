//! Watch streams: newline-delimited `{"type":…,"object":…}` events over a chunked response,
//! starting from a `resourceVersion`, with bookmarks, `sendInitialEvents`, `timeoutSeconds`,
//! and 410 Gone when the history asked for has been compacted.
//!
//! Promises: events arrive in revision order with no gap and no duplicate; with selectors, an
//! object that stops matching is reported DELETED and one that starts matching ADDED (as
//! kube-apiserver's watch cache does); a watch from compacted history, or one that falls
//! behind compaction, gets an ERROR event with a 410 Status and the stream ends, so the client
//! relists.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::convert::{from_storage, storage_of};
use crate::registry::ResourceType;
use crate::selector::{FieldSelector, LabelSelector, labels_of};
use crate::status::ApiError;
use crate::store::{ChangeKind, Compacted};
use crate::table::{self, IncludeObject};

/// Parameters of one watch request.
#[derive(Debug, Clone, Default)]
pub struct WatchRequest {
    /// Namespace filter (`None`: all).
    pub namespace: Option<String>,
    /// `resourceVersion` (`None` or `"0"`: start with the current state).
    pub resource_version: Option<String>,
    /// `labelSelector`.
    pub label_selector: String,
    /// `fieldSelector`.
    pub field_selector: String,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents`.
    pub send_initial_events: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// `Table` output, if asked for.
    pub table: Option<IncludeObject>,
}

struct Filter {
    labels: LabelSelector,
    fields: FieldSelector,
    namespace: Option<String>,
}

impl Filter {
    fn matches(&self, object: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| crate::meta::namespace(object) == ns)
            && self.labels.matches(&labels_of(object))
            && self.fields.matches(object)
    }
}

fn gone(c: Compacted) -> ApiError {
    ApiError::gone(format!(
        "too old resource version: {} ({})",
        c.requested, c.oldest
    ))
}

/// Starts a watch; errors before the stream starts become ordinary status responses.
pub fn serve(
    cluster: Arc<Cluster>,
    resource: ResourceType,
    request: WatchRequest,
    bookmark_interval: Duration,
) -> Result<Response, ApiError> {
    let filter = Filter {
        labels: LabelSelector::parse(&request.label_selector)
            .map_err(|e| ApiError::bad_request(e.0))?,
        fields: FieldSelector::parse(&request.field_selector, &resource.selectable_fields())
            .map_err(|e| ApiError::bad_request(e.0))?,
        namespace: request.namespace.clone(),
    };
    let storage = storage_of(&resource);
    let explicit = request
        .resource_version
        .as_deref()
        .filter(|rv| !rv.is_empty() && *rv != "0");
    let (start, initial) = {
        let state = cluster.lock();
        match explicit {
            Some(rv) if !request.send_initial_events => {
                let revision: u64 = rv.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version {rv:?}"))
                })?;
                if let Err(compacted) = state.store.changes_after(&storage, revision) {
                    // kube-apiserver's watch cache answers 200 with one ERROR event (its
                    // errWatcher); kube-rs and client-go relist on it.
                    let mut line =
                        json!({"type": "ERROR", "object": gone(compacted).to_status()}).to_string();
                    line.push('\n');
                    return Ok((
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "application/json")],
                        line,
                    )
                        .into_response());
                }
                (revision, Vec::new())
            }
            _ => {
                let objects: Vec<Value> = state
                    .store
                    .list(&storage, request.namespace.as_deref())
                    .iter()
                    .map(|o| from_storage(&resource, o))
                    .filter(|o| filter.matches(o))
                    .collect();
                (state.store.revision(), objects)
            }
        }
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(stream_events(
        cluster,
        resource,
        request,
        filter,
        start,
        initial,
        tx,
        bookmark_interval,
    ));
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    }));
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

struct Encoder {
    resource: ResourceType,
    table: Option<IncludeObject>,
    headers_sent: bool,
}

impl Encoder {
    fn event(&mut self, kind: &str, object: &Value) -> Bytes {
        let object = match self.table {
            Some(include) => {
                let t = table::table(
                    &self.resource,
                    std::slice::from_ref(object),
                    json!({"resourceVersion": object["metadata"]["resourceVersion"]}),
                    include,
                    !self.headers_sent,
                );
                self.headers_sent = true;
                t
            }
            None => object.clone(),
        };
        let mut line = json!({"type": kind, "object": object}).to_string();
        line.push('\n');
        Bytes::from(line)
    }

    fn bookmark(&self, revision: u64, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = json!({
            "kind": self.resource.kind,
            "apiVersion": self.resource.api_version(),
            "metadata": metadata,
        });
        let mut line = json!({"type": "BOOKMARK", "object": object}).to_string();
        line.push('\n');
        Bytes::from(line)
    }
}

#[allow(clippy::too_many_arguments)]
async fn stream_events(
    cluster: Arc<Cluster>,
    resource: ResourceType,
    request: WatchRequest,
    filter: Filter,
    mut cursor: u64,
    initial: Vec<Value>,
    tx: mpsc::Sender<Bytes>,
    bookmark_interval: Duration,
) {
    let storage = storage_of(&resource);
    let mut encoder = Encoder {
        resource: resource.clone(),
        table: request.table,
        headers_sent: false,
    };
    let mut revisions = cluster.subscribe();
    let mut drops = cluster.watch_generation();
    drops.borrow_and_update();
    let deadline = Instant::now() + request.timeout.unwrap_or(Duration::from_secs(1800));
    for object in &initial {
        if tx.send(encoder.event("ADDED", object)).await.is_err() {
            return;
        }
    }
    if request.send_initial_events
        && request.bookmarks
        && tx.send(encoder.bookmark(cursor, true)).await.is_err()
    {
        return;
    }
    let mut next_bookmark = Instant::now() + bookmark_interval;
    loop {
        // Seen before reading: every change up to `latest` is in what we read next.
        let latest = *revisions.borrow_and_update();
        let changes = {
            let state = cluster.lock();
            state.store.changes_after(&storage, cursor)
        };
        let changes = match changes {
            Ok(changes) => changes,
            Err(compacted) => {
                let status = gone(compacted).to_status();
                let _ = tx.send(encoder.event("ERROR", &status)).await;
                return;
            }
        };
        for change in changes {
            cursor = change.revision;
            let now = from_storage(&resource, &change.object);
            let before = change.previous.as_ref().map(|p| from_storage(&resource, p));
            let was = before.as_ref().is_some_and(|b| filter.matches(b));
            let is = filter.matches(&now);
            let kind = match (change.kind, was, is) {
                (ChangeKind::Added, _, true) => "ADDED",
                (ChangeKind::Modified, true, true) => "MODIFIED",
                (ChangeKind::Modified, false, true) => "ADDED",
                (ChangeKind::Modified, true, false) => "DELETED",
                (ChangeKind::Deleted, true, _) => "DELETED",
                _ => continue,
            };
            if tx.send(encoder.event(kind, &now)).await.is_err() {
                return;
            }
        }
        // Changes to other resources still move bookmarks forward.
        cursor = cursor.max(latest);
        tokio::select! {
            _ = revisions.changed() => {}
            _ = drops.changed() => return,
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tokio::time::sleep_until(next_bookmark) => {
                next_bookmark = Instant::now() + bookmark_interval;
                if request.bookmarks && tx.send(encoder.bookmark(cursor, false)).await.is_err() {
                    return;
                }
            }
            _ = tx.closed() => return,
        }
    }
}

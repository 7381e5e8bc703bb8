//! Keeps API response bodies out of the logs. kube-client logs the whole body of a response it
//! cannot decode, at WARN, before it returns the error (`Client::request` and
//! `Client::request_status`, as `"{body}, {error:?}"`): for a list, every object of the page,
//! whatever their writers put in them, megabytes of it. The error it returns says what failed
//! (serde's message, with line and column), and ipkeep logs that; [`NoResponseBodies`] drops the
//! body. Its other warnings under that target (`timeout in poll`, `eof in poll`) pass.

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The target of kube-client's warnings that carry a body.
const TARGET: &str = "kube_client::client";

/// How kube-client's warnings under [`TARGET`] that carry no body begin.
const WITHOUT_BODY: [&str; 2] = ["timeout in poll", "eof in poll"];

/// A layer that drops kube-client's warnings that carry a response body.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoResponseBodies;

impl<S: Subscriber> Layer<S> for NoResponseBodies {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        !carries_a_body(event)
    }
}

/// Whether `event` is one of kube-client's warnings with a response body: judged by the
/// first bytes of its message only, so a body is never formatted whole here.
fn carries_a_body(event: &Event<'_>) -> bool {
    let meta = event.metadata();
    if meta.target() != TARGET || *meta.level() != Level::WARN {
        return false;
    }
    let mut head = MessageHead(String::new());
    event.record(&mut head);
    !WITHOUT_BODY.iter().any(|p| head.0.starts_with(p))
}

/// The first [`HEAD`] bytes of an event's message.
struct MessageHead(String);

const HEAD: usize = 32;

impl Visit for MessageHead {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            // Stops the formatting once HEAD bytes are in (the error is expected).
            let _ = write!(self, "{value:?}");
        }
    }
}

impl Write for MessageHead {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if self.0.len() + c.len_utf8() > HEAD {
                return Err(fmt::Error);
            }
            self.0.push(c);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::{Read, Write as _};
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// What a subscriber wrote.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    fn subscriber(out: &Captured, filtered: bool) -> impl Subscriber + Send + Sync + use<> {
        let out = out.clone();
        let fmt = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .finish();
        fmt.with(filtered.then_some(NoResponseBodies))
    }

    #[test]
    fn drops_only_the_warnings_with_a_body() {
        let out = Captured::default();
        tracing::subscriber::with_default(subscriber(&out, true), || {
            let err = serde_json::from_str::<u8>("x").unwrap_err();
            tracing::warn!(target: "kube_client::client", "{}, {:?}", r#"{"items":["SECRET"]}"#, err);
            tracing::warn!(target: "kube_client::client", "timeout in poll: {}", "deadline");
            tracing::warn!(target: "kube_client::client", "eof in poll: {:?}", "eof");
            tracing::warn!(target: "ipkeep", "{}", r#"{"ours":1}"#);
            tracing::error!(target: "kube_client::client", "failed with error x");
        });
        let text = out.text();
        assert!(!text.contains("SECRET"), "{text}");
        for kept in [
            "timeout in poll",
            "eof in poll",
            r#"{"ours":1}"#,
            "failed with error x",
        ] {
            assert!(text.contains(kept), "{kept} missing from {text}");
        }
    }

    /// A server that answers every request with `body` (status 200, JSON), once per connection.
    fn serve(body: &'static str) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        addr
    }

    /// kube-client itself, given a body it cannot decode: its warning carries the body (so this
    /// layer still has something to drop with this kube-client), and the layer drops it.
    #[tokio::test]
    async fn kube_clients_own_warning_loses_its_body() {
        use ipkeep_api::k8s_openapi::api::core::v1::ConfigMap;
        let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"d"},"data":{"k":"TENANT-TEXT"},"binaryData":5}"#;
        let addr = serve(body);
        for filtered in [false, true] {
            let out = Captured::default();
            let _guard = tracing::subscriber::set_default(subscriber(&out, filtered));
            let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
            let client = kube::Client::try_from(config).unwrap();
            let err = kube::Api::<ConfigMap>::namespaced(client, "d")
                .get("c")
                .await
                .unwrap_err();
            assert!(matches!(err, kube::Error::SerdeError(_)), "{err}");
            let text = out.text();
            assert_eq!(text.contains("TENANT-TEXT"), !filtered, "{text}");
        }
    }
}

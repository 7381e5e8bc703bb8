//! Client certificates on the webhook port (`--client-ca`), the cluster started with
//! `--webhook-client-auth`: kube-apiserver presents its client certificate through an
//! AdmissionConfiguration and kube-scheduler through the extender's tlsConfig, so every pin the
//! steps before this one saw went through them; a client without a certificate gets no HTTP.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ipkeep_tests::cluster::Cluster;
use rustls::pki_types::ServerName;

/// `GET /healthz` over TLS to the webhook port, presenting `client` (certificate and key
/// files) if given: the answer's status line, or the error.
fn healthz(cluster: &Cluster, client: Option<(&Path, &Path)>) -> Result<String, String> {
    let env = std::fs::read_to_string(cluster.state().join("ipkeep.env")).expect("ipkeep.env");
    let url = env
        .lines()
        .find_map(|l| l.strip_prefix("IPKEEP_EXT_URL=https://"))
        .expect("IPKEEP_EXT_URL");
    let ca = std::fs::read(cluster.state().join("pki/ca.crt")).expect("the cluster's CA");
    let read = |path: &Path| std::fs::read(path).expect("a client certificate or key file");
    let client = client.map(|(cert, key)| (read(cert), read(key)));
    let client = client.as_ref().map(|(c, k)| (c.as_slice(), k.as_slice()));
    let config = ipkeep_tests::pki::client_config(&ca, client);
    let name = ServerName::try_from("127.0.0.1").expect("a name");
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(url).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    answer
        .lines()
        .next()
        .map(str::to_string)
        .ok_or_else(|| "no answer".to_string())
}

/// The scheduler extension's metrics, from its plain-HTTP probe port.
fn metrics(cluster: &Cluster) -> String {
    let env = std::fs::read_to_string(cluster.state().join("ipkeep.env")).expect("ipkeep.env");
    let probe = env
        .lines()
        .find_map(|l| l.strip_prefix("IPKEEP_EXT_PROBE=http://"))
        .expect("IPKEEP_EXT_PROBE");
    let mut s = TcpStream::connect(probe).expect("the probe port");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    text
}

/// The value of the first series of `metrics` whose line starts with `series`.
fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
        .unwrap_or(0.0)
}

pub fn the_webhook_port_serves_only_client_certificates_from_its_ca(cluster: &Cluster) {
    let env = std::fs::read_to_string(cluster.state().join("ipkeep.env")).expect("ipkeep.env");
    assert!(
        env.contains("IPKEEP_EXT_CLIENT_AUTH=1"),
        "client certificates: the cluster was started without --webhook-client-auth"
    );
    let before = metrics(cluster);
    // The API server's and kube-scheduler's calls were served (pins applied by both before;
    // with the admission policy, the API server pins without calling).
    let mut served = vec![r#"ipkeep_scheduler_ext_pins_applied_total{endpoint="filter"}"#];
    if cluster.admission() == ipkeep_tests::cluster::Admission::Webhook {
        served.push(r#"ipkeep_scheduler_ext_pins_applied_total{endpoint="mutate-pods"}"#);
    }
    for series in served {
        assert!(
            value(&before, series) >= 1.0,
            "client certificates: no {series} served:\n{before}"
        );
    }
    let refused = |m: &str| {
        value(
            m,
            r#"ipkeep_scheduler_ext_connections_refused_total{listener="webhook",reason="handshake-failed"}"#,
        )
    };
    let answer = healthz(cluster, None);
    assert!(
        answer.is_err(),
        "client certificates: a client without one was answered: {answer:?}"
    );
    let pki = cluster.state().join("pki");
    let apiserver = (
        pki.join("apiserver-webhook-client.crt"),
        pki.join("apiserver-webhook-client.key"),
    );
    let answer = healthz(cluster, Some((&apiserver.0, &apiserver.1)));
    assert_eq!(
        answer.as_deref(),
        Ok("HTTP/1.1 200 OK"),
        "client certificates: the API server's certificate"
    );
    let after = metrics(cluster);
    assert!(
        refused(&after) >= refused(&before) + 1.0,
        "client certificates: the refusal is not counted:\n{after}"
    );
}

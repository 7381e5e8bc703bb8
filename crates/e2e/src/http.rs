//! The two kinds of HTTP the simulators speak: a plain GET of a probe or metrics endpoint, and
//! the scheduler's HTTPS POST to the extender (verified against the extender's CA and server
//! name, as kube-scheduler does with `tlsConfig.caFile` and `serverName`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// `GET path` over plain HTTP/1.0: the status code and the body, `None` if unreachable.
pub async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).await.ok()?;
        let code = text.get(9..12)?.parse().ok()?;
        Some((code, text.split_once("\r\n\r\n")?.1.to_string()))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// Waits until `GET path` answers 200.
pub async fn wait_ok(addr: SocketAddr, path: &str, within: Duration, what: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if get(addr, path).await.is_some_and(|(c, _)| c == 200) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{what} did not answer 200 on http://{addr}{path} within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sum of the samples of `metric` whose labels contain every `labels` pair, from a
/// Prometheus text exposition.
pub fn metric_sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An HTTPS client that trusts one CA and checks one server name.
#[derive(Clone, Debug)]
pub struct HttpsClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl HttpsClient {
    /// Trusts only `ca_pem`; verifies the server's certificate for `server_name`.
    pub fn new(ca_pem: &str, server_name: &str) -> Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.context("the CA file")?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|e| anyhow!("server name {server_name:?}: {e}"))?;
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .with_server_name_resolver(FixedServerNameResolver::new(name))
            .enable_http1()
            .build();
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// POSTs JSON to `url` within `timeout`; the status and the body.
    pub async fn post_json(
        &self,
        url: &str,
        body: &serde_json::Value,
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>)> {
        let request = hyper::Request::post(url)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
        let exchange = async {
            let response = self.client.request(request).await?;
            let status = response.status().as_u16();
            let bytes = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, bytes.to_vec()))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| anyhow!("POST {url}: no answer within {timeout:?}"))?
            .with_context(|| format!("POST {url}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_matches_name_and_labels_exactly() {
        let text = "# HELP x\nipkeep_a_total{reason=\"del\",n=\"1\"} 2\nipkeep_a_total{reason=\"gc\"} 3\nipkeep_a_total_more 7\nipkeep_a_total 1\n";
        assert_eq!(metric_sum(text, "ipkeep_a_total", &[]), 6.0);
        assert_eq!(
            metric_sum(text, "ipkeep_a_total", &[("reason", "del")]),
            2.0
        );
        assert_eq!(metric_sum(text, "ipkeep_b", &[]), 0.0);
    }
}

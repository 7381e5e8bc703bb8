//! TLS for the webhook and extender port: a certificate and key from PEM files and, with
//! `--client-ca`, a CA that every client's certificate must chain to ([`client_ca`]).
//! All are reloaded when their files change (a Secret mounted in the pod is updated in place by
//! the kubelet, cert-manager renews it); a failed reload keeps what is in use and says why.
//!
//! The serving certificate's expiry is exported (`certificate_expiry_timestamp_seconds`) and
//! logged as a warning from [`EXPIRY_WARNING`] before it: an expired certificate makes both
//! webhooks and the extender fail, and they fail open.

pub mod client_ca;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipkeep_listener::{ALPN_H2, ALPN_HTTP1, TlsConfigs};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::metrics::Metrics;
use client_ca::ReloadingClientCa;

/// How long before the serving certificate expires the server warns, and the shipped alert
/// fires. cert-manager (`deploy/scheduler-ext/certificate.yaml`) renews 30 days before, so a
/// warning means the renewal has been failing for over a week.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(21 * 24 * 3600);

/// How often, at most, the expiry warning is repeated.
const WARN_EVERY: Duration = Duration::from_secs(24 * 3600);

/// A certificate, key or CA that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("failed to read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate file has no PEM certificate.
    #[error("{0} holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    NoCertificate(PathBuf),
    /// A PEM block does not parse.
    #[error("{path} is not valid PEM: {reason}")]
    BadPem {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A certificate's DER does not parse as X.509.
    #[error("{path}: the certificate cannot be read as X.509: {reason}")]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key is of an unsupported type, or does not go with the certificate.
    #[error("the key in {path} cannot be used: {reason}")]
    BadKey {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The client CA cannot verify client certificates.
    #[error("the client CA in {path} cannot be used: {reason}")]
    BadClientCa {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("failed to build the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Where the certificate and key are.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// PEM certificate chain (leaf first).
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// A file's contents.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The certificates of a PEM file, at least one.
pub(crate) fn certificates(
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

/// When `cert` expires, in seconds since the Unix epoch.
fn not_after(path: &Path, cert: &CertificateDer<'_>) -> Result<i64, TlsError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| {
        TlsError::BadCertificate {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    })?;
    Ok(parsed.validity().not_after.timestamp())
}

/// A certificate, its key, and when it expires.
#[derive(Debug)]
struct Served {
    key: Arc<CertifiedKey>,
    pem: Pem,
    not_after: i64,
}

impl CertFiles {
    /// The files' current contents.
    fn contents(&self) -> Result<Pem, TlsError> {
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    /// A certified key from the files' contents.
    fn certified(&self, pem: Pem) -> Result<Served, TlsError> {
        let certs = certificates(&self.cert, &pem.0)?;
        let not_after = not_after(&self.cert, &certs[0])?;
        let bad_key = |reason: String| TlsError::BadKey {
            path: self.key.clone(),
            reason,
        };
        let key = PrivateKeyDer::from_pem_slice(&pem.1).map_err(|e| bad_key(e.to_string()))?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| bad_key(e.to_string()))?;
        let certified = CertifiedKey::new(certs, signing);
        certified
            .keys_match()
            .map_err(|e| bad_key(format!("it does not match the certificate ({e})")))?;
        Ok(Served {
            key: Arc::new(certified),
            pem,
            not_after,
        })
    }
}

/// The certificate and key files' contents, PEM.
type Pem = (Vec<u8>, Vec<u8>);

/// Serves the current certificate; [`Self::reload_if_changed`] swaps it.
#[derive(Debug)]
pub struct ReloadingCert {
    files: CertFiles,
    current: RwLock<Served>,
}

impl ReloadingCert {
    /// Loads the files; fails if they cannot be used now.
    pub fn load(files: CertFiles) -> Result<Self, TlsError> {
        let served = files.certified(files.contents()?)?;
        Ok(Self {
            files,
            current: RwLock::new(served),
        })
    }

    /// Reloads when the files' contents differ from what is served. Returns `Ok(true)` when a
    /// new certificate is now served.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let contents = self.files.contents()?;
        if self.current.read().unwrap_or_else(|e| e.into_inner()).pem == contents {
            return Ok(false);
        }
        let served = self.files.certified(contents)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = served;
        Ok(true)
    }

    /// When the served certificate expires, in seconds since the Unix epoch.
    pub fn not_after(&self) -> i64 {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .not_after
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .key
                .clone(),
        )
    }
}

/// The configurations a connection may get: offering HTTP/2 first (kube-apiserver then sends
/// every webhook call over one connection; over HTTP/1.1 it opened a new connection, with a
/// full TLS handshake, for most calls of a burst), or HTTP/1.1 only (for a client whose
/// address has its share of HTTP/2 connections, see `ipkeep_listener::table`).
#[derive(Debug)]
struct Configs {
    http2: Arc<ServerConfig>,
    http1: Arc<ServerConfig>,
}

/// The webhook port's TLS: the reloading certificate, and the reloading client CA if any.
#[derive(Debug)]
pub struct ServingTls {
    cert: Arc<ReloadingCert>,
    client_ca: Option<ReloadingClientCa>,
    configs: RwLock<Configs>,
}

impl ServingTls {
    /// Loads the certificate and, if given, the client CA; fails if they cannot be used now.
    pub fn load(files: CertFiles, client_ca: Option<PathBuf>) -> Result<Arc<Self>, TlsError> {
        let cert = Arc::new(ReloadingCert::load(files)?);
        let client_ca = client_ca.map(ReloadingClientCa::load).transpose()?;
        let configs = configs(&cert, client_ca.as_ref().map(ReloadingClientCa::verifier))?;
        Ok(Arc::new(Self {
            cert,
            client_ca,
            configs: RwLock::new(configs),
        }))
    }

    /// The serving certificate.
    pub fn certificate(&self) -> &ReloadingCert {
        &self.cert
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.client_ca.is_some()
    }

    /// Checks the files every `interval` until the process ends, keeping `metrics` current.
    pub async fn watch(self: Arc<Self>, interval: Duration, metrics: Arc<Metrics>) {
        metrics.certificate_expiry(self.cert.not_after());
        let mut warned: Option<tokio::time::Instant> = None;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.cert.reload_if_changed() {
                Ok(false) => {}
                Ok(true) => {
                    metrics.cert_reload("certificate", true);
                    metrics.certificate_expiry(self.cert.not_after());
                    warned = None;
                    tracing::info!(cert = %self.cert.files.cert.display(), expires = self.cert.not_after(), "TLS certificate reloaded");
                }
                Err(e) => {
                    metrics.cert_reload("certificate", false);
                    tracing::error!(error = %e, "TLS certificate not reloaded; still serving the previous one");
                }
            }
            if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY)
                && warn_if_expiring(
                    &self.cert.files.cert,
                    self.cert.not_after(),
                    SystemTime::now(),
                )
            {
                warned = Some(tokio::time::Instant::now());
            }
            self.reload_client_ca(&metrics);
        }
    }

    fn reload_client_ca(&self, metrics: &Metrics) {
        let Some(ca) = &self.client_ca else { return };
        let result = ca.reload_if_changed().and_then(|changed| {
            if changed {
                *self.configs.write().unwrap_or_else(|e| e.into_inner()) =
                    configs(&self.cert, Some(ca.verifier()))?;
            }
            Ok(changed)
        });
        match result {
            Ok(false) => {}
            Ok(true) => {
                metrics.cert_reload("client-ca", true);
                tracing::info!(client_ca = %ca.path().display(), "client CA reloaded");
            }
            Err(e) => {
                metrics.cert_reload("client-ca", false);
                tracing::error!(error = %e, "client CA not reloaded; still verifying clients with the previous one");
            }
        }
    }
}

impl TlsConfigs for ServingTls {
    fn server_config(&self, http2: bool) -> Arc<ServerConfig> {
        let configs = self.configs.read().unwrap_or_else(|e| e.into_inner());
        if http2 {
            configs.http2.clone()
        } else {
            configs.http1.clone()
        }
    }
}

/// Both configurations for `cert`, requiring client certificates that `clients` accepts.
fn configs(
    cert: &Arc<ReloadingCert>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
) -> Result<Configs, TlsError> {
    let one = |alpn: &[&[u8]]| -> Result<Arc<ServerConfig>, TlsError> {
        let builder =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?;
        let builder = match &clients {
            Some(verifier) => builder.with_client_cert_verifier(verifier.clone()),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(cert.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    };
    Ok(Configs {
        http2: one(&[ALPN_H2, ALPN_HTTP1])?,
        http1: one(&[ALPN_HTTP1])?,
    })
}

/// Logs a warning (an error once expired) when the certificate in `path` expires within
/// [`EXPIRY_WARNING`] of `now`; whether it did.
fn warn_if_expiring(path: &Path, not_after: i64, now: SystemTime) -> bool {
    let now = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let left = not_after.saturating_sub(now);
    let warning = i64::try_from(EXPIRY_WARNING.as_secs()).unwrap_or(i64::MAX);
    if left > warning {
        return false;
    }
    let days = left / 86_400;
    if left <= 0 {
        tracing::error!(
            cert = %path.display(),
            not_after,
            "the serving certificate has expired: the API server and kube-scheduler refuse it, and both webhooks and the extender fail open; renew it (docs/install.md, step 3)"
        );
    } else {
        tracing::warn!(
            cert = %path.display(),
            not_after,
            days_left = days,
            "the serving certificate expires in {days} days; renew it (docs/install.md, step 3), or check why cert-manager has not"
        );
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A self-signed certificate for `name` that expires at the start of `year`-01-01, and
    /// its key; and that time, in seconds since the epoch.
    fn pair(name: &str, year: i32) -> (String, String, i64) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
        let cert = params.self_signed(&key).unwrap();
        let at = params.not_after.unix_timestamp();
        (cert.pem(), key.serialize_pem(), at)
    }

    fn served(cert: &ReloadingCert) -> Vec<u8> {
        let current = cert.current.read().unwrap();
        current.key.cert[0].to_vec()
    }

    #[test]
    fn reloads_changed_files_and_keeps_serving_through_a_bad_pair() {
        let dir = tempfile::tempdir().unwrap();
        let files = CertFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let (c1, k1, t1) = pair("one.example", 2040);
        std::fs::write(&files.cert, &c1).unwrap();
        std::fs::write(&files.key, &k1).unwrap();
        let cert = ReloadingCert::load(files.clone()).unwrap();
        let first = served(&cert);
        assert_eq!(cert.not_after(), t1);
        assert!(!cert.reload_if_changed().unwrap(), "unchanged files");

        // A key that does not go with the certificate: refused, the old pair stays.
        let (c2, k2, t2) = pair("two.example", 2041);
        std::fs::write(&files.cert, &c2).unwrap();
        let err = cert.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("does not match the certificate"), "{err}");
        assert_eq!(served(&cert), first);
        assert_eq!(cert.not_after(), t1, "the expiry of what is served");

        std::fs::write(&files.key, &k2).unwrap();
        assert!(cert.reload_if_changed().unwrap());
        assert_ne!(served(&cert), first);
        assert_eq!(cert.not_after(), t2);

        std::fs::write(&files.cert, "not pem").unwrap();
        let err = cert.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        std::fs::remove_file(&files.key).unwrap();
        let err = cert.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("failed to read"), "{err}");
        assert!(ReloadingCert::load(files).is_err());
    }

    /// A Secret volume mounted with `items` (the chart mounts tls.crt and tls.key only): the
    /// kubelet writes each version into a directory of its own, points `..data` at it, and the
    /// files are symlinks through `..data`; an update swaps `..data` in one rename. The reload
    /// reads the files through the links, so it sees the new pair, and nothing else of the
    /// Secret is there.
    #[test]
    fn reloads_through_the_kubelets_atomic_swap_of_a_secret_volume() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let version = |n: u32, cert: &str, key: &str| {
            let v = dir.path().join(format!("..2026_11_29_0{n}"));
            std::fs::create_dir(&v).unwrap();
            std::fs::write(v.join("tls.crt"), cert).unwrap();
            std::fs::write(v.join("tls.key"), key).unwrap();
            let tmp = dir.path().join("..data_tmp");
            symlink(v.file_name().unwrap(), &tmp).unwrap();
            std::fs::rename(&tmp, dir.path().join("..data")).unwrap();
        };
        let (c1, k1, t1) = pair("one.example", 2040);
        version(1, &c1, &k1);
        for f in ["tls.crt", "tls.key"] {
            symlink(format!("..data/{f}"), dir.path().join(f)).unwrap();
        }
        let files = CertFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let cert = ReloadingCert::load(files).unwrap();
        assert_eq!(cert.not_after(), t1);
        let (c2, k2, t2) = pair("two.example", 2041);
        version(2, &c2, &k2);
        assert!(
            cert.reload_if_changed().unwrap(),
            "the swapped pair is read"
        );
        assert_eq!(cert.not_after(), t2);
        assert!(!dir.path().join("ca.key").exists());
    }

    #[test]
    fn warns_within_the_warning_period_only() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let at = |days: i64| 1_800_000_000 + days * 86_400;
        let path = Path::new("tls.crt");
        assert!(!warn_if_expiring(path, at(22), now));
        assert!(warn_if_expiring(path, at(20), now));
        assert!(warn_if_expiring(path, at(-1), now), "expired");
    }
}

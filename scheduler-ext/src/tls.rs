//! TLS with a certificate and key from PEM files, reloaded when the files change (a Secret
//! mounted in the pod is updated in place by the kubelet, cert-manager renews it). A failed
//! reload keeps the certificate in use and says why.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::metrics::Metrics;

/// A certificate or key that cannot be used.
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
    /// The key is of an unsupported type, or does not go with the certificate.
    #[error("the key in {path} cannot be used: {reason}")]
    BadKey {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("failed to build the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// HTTP/2's ALPN protocol name.
pub const ALPN_H2: &[u8] = b"h2";

/// Where the certificate and key are.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// PEM certificate chain (leaf first).
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl CertFiles {
    /// The files' current contents.
    fn contents(&self) -> Result<Pem, TlsError> {
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    /// Builds a certified key from the files' contents.
    fn certified(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
        let certs = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::BadPem {
                path: self.cert.clone(),
                reason: e.to_string(),
            })?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate(self.cert.clone()));
        }
        let bad_key = |reason: String| TlsError::BadKey {
            path: self.key.clone(),
            reason,
        };
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| bad_key(e.to_string()))?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| bad_key(e.to_string()))?;
        let certified = CertifiedKey::new(certs, signing);
        certified
            .keys_match()
            .map_err(|e| bad_key(format!("it does not match the certificate ({e})")))?;
        Ok(certified)
    }
}

/// The certificate and key files' contents, PEM.
type Pem = (Vec<u8>, Vec<u8>);

/// Serves the current certificate; [`Self::reload_if_changed`] swaps it.
#[derive(Debug)]
pub struct ReloadingCert {
    files: CertFiles,
    current: RwLock<(Arc<CertifiedKey>, Pem)>,
}

impl ReloadingCert {
    /// Loads the files; fails if they cannot be used now.
    pub fn load(files: CertFiles) -> Result<Self, TlsError> {
        let contents = files.contents()?;
        let key = files.certified(&contents.0, &contents.1)?;
        Ok(Self {
            files,
            current: RwLock::new((Arc::new(key), contents)),
        })
    }

    /// Reloads when the files' contents differ from what is served. Returns `Ok(true)` when a
    /// new certificate is now served.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let contents = self.files.contents()?;
        if self.current.read().unwrap_or_else(|e| e.into_inner()).1 == contents {
            return Ok(false);
        }
        let key = self.files.certified(&contents.0, &contents.1)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (Arc::new(key), contents);
        Ok(true)
    }

    /// The rustls server configuration serving this certificate: HTTP/2 offered first (kube-apiserver
    /// then sends every webhook call over one connection; over HTTP/1.1 it opened a new
    /// connection, with a full TLS handshake, for most calls of a burst), HTTP/1.1 beside it.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<ServerConfig>, TlsError> {
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![ALPN_H2.to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Checks the files every `interval` until the process ends.
    pub async fn watch(self: Arc<Self>, interval: Duration, metrics: Arc<Metrics>) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.reload_if_changed() {
                Ok(false) => {}
                Ok(true) => {
                    metrics.cert_reload(true);
                    tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                }
                Err(e) => {
                    metrics.cert_reload(false);
                    tracing::error!(error = %e, "TLS certificate not reloaded; still serving the previous one");
                }
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .0
                .clone(),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn served(cert: &ReloadingCert) -> Vec<u8> {
        let current = cert.current.read().unwrap();
        current.0.cert[0].to_vec()
    }

    #[test]
    fn reloads_changed_files_and_keeps_serving_through_a_bad_pair() {
        let dir = tempfile::tempdir().unwrap();
        let files = CertFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let (c1, k1) = pair("one.example");
        std::fs::write(&files.cert, &c1).unwrap();
        std::fs::write(&files.key, &k1).unwrap();
        let cert = ReloadingCert::load(files.clone()).unwrap();
        let first = served(&cert);
        assert!(!cert.reload_if_changed().unwrap(), "unchanged files");

        // A key that does not go with the certificate: refused, the old pair stays.
        let (c2, k2) = pair("two.example");
        std::fs::write(&files.cert, &c2).unwrap();
        let err = cert.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("does not match the certificate"), "{err}");
        assert_eq!(served(&cert), first);

        std::fs::write(&files.key, &k2).unwrap();
        assert!(cert.reload_if_changed().unwrap());
        assert_ne!(served(&cert), first);

        std::fs::write(&files.cert, "not pem").unwrap();
        let err = cert.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        std::fs::remove_file(&files.key).unwrap();
        let err = cert.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("failed to read"), "{err}");
        assert!(ReloadingCert::load(files).is_err());
    }
}

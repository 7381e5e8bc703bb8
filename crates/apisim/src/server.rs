//! Running the API server: bind a loopback listener, serve the router on a tokio task, and
//! hand out what clients need (URL, kubeconfig, a ready `kube::Client`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::cluster::Cluster;
use crate::faults::Fault;
use crate::http::{AppState, router};

/// How to start a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Changes kept for watches; older `resourceVersion`s get 410 Gone.
    pub max_history: usize,
    /// How often idle watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Loopback addresses of webhook Services: (namespace, name) → where it really listens.
    pub service_endpoints: HashMap<(String, String), SocketAddr>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_history: 10_000,
            bookmark_interval: Duration::from_secs(10),
            service_endpoints: HashMap::new(),
        }
    }
}

/// A running server; stops when dropped.
#[derive(Debug)]
pub struct ApiServer {
    address: SocketAddr,
    cluster: Arc<Cluster>,
    task: JoinHandle<()>,
}

impl ApiServer {
    /// Starts a server with the default configuration on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(ServerConfig::default()).await
    }

    /// Starts a server.
    pub async fn start_with(config: ServerConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind(config.listen).await?;
        let address = listener.local_addr()?;
        let cluster = Arc::new(Cluster::new(config.max_history, config.service_endpoints));
        let app = router(AppState {
            cluster: Arc::clone(&cluster),
            address: address.to_string(),
            bookmark_interval: config.bookmark_interval,
        });
        let task = tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                tracing::error!("api server stopped: {err}");
            }
        });
        Ok(Self {
            address,
            cluster,
            task,
        })
    }

    /// The listening address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The control plane, for assertions and direct manipulation in tests.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// A kubeconfig (YAML) that kubectl and kube-rs accept, with `namespace` as the default.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        kubeconfig(&self.url(), namespace)
    }

    /// A real `kube::Client` talking to this server over HTTP, default namespace `default`.
    pub fn client(&self) -> Result<kube::Client, ClientError> {
        let uri = axum::http::Uri::builder()
            .scheme("http")
            .authority(self.address.to_string())
            .path_and_query("/")
            .build()?;
        Ok(kube::Client::try_from(kube::Config::new(uri))?)
    }

    /// Makes the next `fault.count` matching requests fail.
    pub fn inject(&self, fault: Fault) {
        self.cluster.faults.inject(fault);
    }

    /// Closes every open watch.
    pub fn drop_watches(&self) {
        self.cluster.drop_watches();
    }

    /// Forgets history: the next watch from an older version gets 410 Gone.
    pub fn compact(&self) {
        self.cluster.compact();
    }
}

/// Building a client for the server failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server address did not make a URL.
    #[error("failed to build the server URL: {0}")]
    Url(#[from] axum::http::Error),
    /// kube refused the configuration.
    #[error("failed to build a kube client: {0}")]
    Kube(#[from] kube::Error),
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A kubeconfig for `url` with one cluster, user and context named `apisim`.
pub fn kubeconfig(url: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: apisim\n  cluster:\n    server: {url}\n\
         users:\n- name: apisim\n  user: {{}}\n\
         contexts:\n- name: apisim\n  context:\n    cluster: apisim\n    user: apisim\n    namespace: {namespace}\n\
         current-context: apisim\npreferences: {{}}\n"
    )
}

//! The real `ipkeep-scheduler-ext` binary, over HTTPS, called as a mutating webhook by a real
//! kube-apiserver (`ipkeep_tests::apiserver`) through the MutatingWebhookConfiguration in
//! `deploy/` on pod CREATE (its service reference swapped for a URL on loopback, as
//! `scripts/cluster.sh` registers it for local processes).
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::{SERVICE, pki};
use tokio_rustls::client::TlsStream;

/// `/mutate-pods` requests served so far, all outcomes, from `/metrics`.
async fn webhook_calls(probe: SocketAddr) -> u64 {
    let (_, metrics) = http_get(probe, "/metrics").await.unwrap();
    metrics
        .lines()
        .filter(|l| l.starts_with("ipkeep_scheduler_ext_requests_total{endpoint=\"mutate-pods\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// A TLS connection to the server (which must accept TCP) trusting only `ca` (PEM).
async fn tls(addr: SocketAddr, ca: &str) -> std::io::Result<TlsStream<tokio::net::TcpStream>> {
    let config = ipkeep_tests::pki::client_config(ca.as_bytes(), None);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(SERVICE).unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
}

/// Whether a TLS handshake with the server succeeds when only `ca` (PEM) is trusted.
async fn handshake(addr: SocketAddr, ca: &str) -> bool {
    tls(addr, ca).await.is_ok()
}

/// A POST over HTTPS (trusting only `ca`): the status code and the body.
async fn https_post(addr: SocketAddr, ca: &str, path: &str, body: &str) -> (u16, String) {
    use http_body_util::BodyExt;
    let tls = tls(addr, ca).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::post(path)
        .header("host", SERVICE)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(axum::body::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let code = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (code, String::from_utf8_lossy(&bytes).into_owned())
}

/// The binary, killed when dropped.
struct Ext(Child);

impl Drop for Ext {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plain HTTP/1.0 GET (blocking; loopback only): the status code and the body.
async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.get(9..12)?.parse().ok()?;
    Some((code, text.split_once("\r\n\r\n")?.1.to_string()))
}

async fn create<K>(client: &Client, namespace: &str, value: Value) -> K
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).unwrap();
    Api::<K>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .unwrap()
}

async fn create_global<K>(client: &Client, value: Value) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).unwrap();
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .unwrap()
}

fn statefulset_pod(name: &str, sts_uid: &str, spec: Value) -> Value {
    let mut pod = json!({
        "metadata": {"name": name, "labels": {"app": "db", "statefulset.kubernetes.io/pod-name": name},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": sts_uid, "controller": true}]},
        "spec": {"containers": [{"name": "db", "image": "postgres:17"}]}
    });
    if let (Value::Object(a), Value::Object(b)) = (&mut pod["spec"], spec) {
        a.extend(b);
    }
    pod
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_calls_the_webhook_over_https_on_pod_create() {
    let listen = ipkeep_tests::free_addr();
    let probe = ipkeep_tests::free_addr();
    let Some(ns) = ipkeep_tests::apiserver::namespace(
        "api_server_calls_the_webhook_over_https_on_pod_create",
        "webhook",
    )
    .await
    else {
        return;
    };
    let client = ns.client.clone();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    ns.create_namespace("prod", json!({})).await;
    ns.create_namespace("quiet", json!({"ipkeep.dev/webhook": "disabled"}))
        .await;
    for (node, zone) in [("n1", "a"), ("n2", "a"), ("n3", "b")] {
        create_global::<Node>(
            &client,
            json!({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node, "topology.kubernetes.io/zone": zone}}}),
        )
        .await;
    }

    // The binary, as deployed: HTTPS with files, probes on plain HTTP.
    let dir = tempfile::tempdir().unwrap();
    let first = pki();
    let (cert, key, kubeconfig) = (
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
        dir.path().join("kubeconfig"),
    );
    std::fs::write(&cert, &first.cert).unwrap();
    std::fs::write(&key, &first.key).unwrap();
    std::fs::write(&kubeconfig, ns.server.kubeconfig("default")).unwrap();
    let _ext = Ext(Command::new(env!("CARGO_BIN_EXE_ipkeep-scheduler-ext"))
        .args([
            "--webhook-listen",
            &listen.to_string(),
            "--probe-listen",
            &probe.to_string(),
        ])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .args([
            "--cert-reload-interval",
            "100ms",
            "--log",
            "info,ipkeep_scheduler_ext=debug",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .spawn()
        .unwrap());
    wait_until("/readyz", || async {
        http_get(probe, "/readyz")
            .await
            .is_some_and(|(c, _)| c == 200)
    })
    .await;

    // The webhook configuration from deploy/, with our CA, at the binary's URL.
    let yaml = std::fs::read_to_string(root.join("deploy/scheduler-ext/webhook.yaml")).unwrap();
    let mut hook: Value = serde_saphyr::from_str(&yaml).unwrap();
    let path = hook["webhooks"][0]["clientConfig"]["service"]["path"].clone();
    hook["webhooks"][0]["clientConfig"] = json!({
        "url": format!("https://{listen}{}", path.as_str().unwrap()),
        "caBundle": BASE64.encode(&first.ca),
    });
    create_global::<MutatingWebhookConfiguration>(&client, hook.clone()).await;

    let sts: StatefulSet = create(&client, "prod", json!({
        "metadata": {"name": "db"},
        "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "postgres:17"}]}}}
    }))
    .await;
    let sts_uid = sts.uid().unwrap();
    // A pod of db in prod, as the StatefulSet controller creates it, with `spec` added.
    let prod_pod = |name: &str, spec: Value| {
        create::<Pod>(&client, "prod", statefulset_pod(name, &sts_uid, spec))
    };
    let pps_api: Api<ipkeep_api::PersistentPodState> = Api::namespaced(client.clone(), "prod");
    let pps: ipkeep_api::PersistentPodState = serde_json::from_value(json!({
        "apiVersion": "ipkeep.dev/v1alpha1", "kind": "PersistentPodState",
        "metadata": {"name": "db"},
        "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"},
            "requiredPersistentTopology": {"nodeTopologyKeys": ["kubernetes.io/hostname"]},
            "ipRetention": "6h"}
    }))
    .unwrap();
    pps_api.create(&PostParams::default(), &pps).await.unwrap();
    let status = json!({"status": {"targetUID": sts_uid, "podStates": {
        "db-0": {"nodeName": "n1", "nodeTopologyLabels": {"kubernetes.io/hostname": "n1"}, "podIPs": ["10.1.0.7"]},
        "db-2": {"nodeName": "n3", "nodeTopologyLabels": {"kubernetes.io/hostname": "n3"}}
    }}});
    pps_api
        .patch_status("db", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "prod");
    // The scheduler extension sees the record through its watch.
    wait_until("the record in the cache", || async {
        let probe_pod = statefulset_pod("db-0", &sts_uid, json!({}));
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let p: Pod = serde_json::from_value(probe_pod).unwrap();
        pods.create(&dry, &p)
            .await
            .is_ok_and(|p| p.annotations().contains_key("ipkeep.dev/pinned-by"))
    })
    .await;

    // db-0: recorded on n1 → pinned, retention from the PersistentPodState.
    let p = prod_pod("db-0", json!({})).await;
    assert_eq!(p.annotations()["ipkeep.dev/pinned-by"], "db");
    assert_eq!(p.annotations()["ipkeep.dev/ip-retention"], "6h");
    let terms = serde_json::to_value(&p.spec.as_ref().unwrap().affinity).unwrap();
    assert_eq!(
        terms["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}])
    );

    // db-1: no record → retention only.
    let p = prod_pod("db-1", json!({})).await;
    assert_eq!(p.annotations()["ipkeep.dev/ip-retention"], "6h");
    assert!(p.spec.as_ref().unwrap().affinity.is_none());

    // db-2: the template insists on n2, the record says n3 → skipped, said on the pod (the
    // controller turns the mark into a PinSkipped Event once it sees the pod).
    let p = prod_pod(
        "db-2",
        json!({"nodeSelector": {"kubernetes.io/hostname": "n2"}}),
    )
    .await;
    assert!(p.annotations()["ipkeep.dev/pin-skipped"].contains("kubernetes.io/hostname=n2"));
    assert!(p.spec.as_ref().unwrap().affinity.is_none());

    // Anyone who can reach the server can send it a review: a forged one, for a pod that does
    // not exist, is answered and changes nothing in the cluster.
    let mut forged = statefulset_pod(
        "db-7",
        &sts_uid,
        json!({"nodeSelector": {"kubernetes.io/hostname": "n2"}}),
    );
    forged["metadata"]["namespace"] = json!("prod");
    let mut review: Value = serde_json::from_str(include_str!(
        "fixtures/admission-review-sts-pod-create.json"
    ))
    .unwrap();
    review["request"]["namespace"] = json!("prod");
    review["request"]["name"] = json!("db-7");
    review["request"]["object"] = forged;
    // A record for db-7 (its pod is gone), so that the pin the review asks about is skipped.
    let record = json!({"status": {"podStates": {
        "db-7": {"nodeName": "n3", "nodeTopologyLabels": {"kubernetes.io/hostname": "n3"}}}}});
    pps_api
        .patch_status("db", &PatchParams::default(), &Patch::Merge(&record))
        .await
        .unwrap();
    wait_until("the db-7 record in the cache", || async {
        let (_, answer) = https_post(listen, &first.ca, "/mutate-pods", &review.to_string()).await;
        answer.contains("not pinned")
    })
    .await;
    let (code, answer) = https_post(listen, &first.ca, "/mutate-pods", &review.to_string()).await;
    assert_eq!(code, 200, "{answer}");
    assert!(answer.contains("\"allowed\":true"), "{answer}");
    assert!(answer.contains("pod db-7 not pinned"), "{answer}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let events: Api<Event> = Api::namespaced(client.clone(), "prod");
    let published: Vec<_> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("PinSkipped"))
        .collect();
    assert!(
        published.is_empty(),
        "the webhook publishes no Events: {published:#?}"
    );

    // Pods the selectors exclude never reach the server.
    let mut unlabelled = statefulset_pod("db-0x", &sts_uid, json!({}));
    unlabelled["metadata"]["labels"] = json!({"app": "db"});
    let p: Pod = create(&client, "prod", unlabelled).await;
    assert!(p.annotations().is_empty());
    let calls = webhook_calls(probe).await;
    assert!(
        calls >= 4,
        "db-0 (dry runs and real), db-1, db-2: {calls} calls"
    );
    let before = calls;
    let p: Pod = create(&client, "quiet", {
        let mut pod = statefulset_pod("db-0", &sts_uid, json!({}));
        pod["metadata"]["ownerReferences"] = json!([]);
        pod
    })
    .await;
    assert!(p.annotations().is_empty());
    let after = webhook_calls(probe).await;
    assert_eq!(
        after, before,
        "the opted-out namespace is not sent to the webhook"
    );

    // Certificate rotation: new files from another CA are picked up without a restart; with
    // the new CA in the configuration, pods are still pinned.
    let second = pki();
    std::fs::write(&key, &second.key).unwrap();
    std::fs::write(&cert, &second.cert).unwrap();
    wait_until("the certificate reload", || async {
        http_get(probe, "/metrics").await.is_some_and(|(_, m)| {
            m.contains("ipkeep_scheduler_ext_certificate_reloads_total{file=\"certificate\",result=\"ok\"} 1")
        })
    })
    .await;
    // New connections get the new certificate (the API server's pooled connections may keep
    // the old session until they close, as with a real API server).
    assert!(
        handshake(listen, &second.ca).await,
        "new CA accepted after the reload"
    );
    assert!(
        !handshake(listen, &first.ca).await,
        "old CA no longer matches"
    );
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut current = hooks.get("ipkeep-scheduler-ext").await.unwrap();
    current.webhooks.as_mut().unwrap()[0]
        .client_config
        .ca_bundle = Some(k8s_openapi::ByteString(second.ca.clone().into_bytes()));
    hooks
        .replace("ipkeep-scheduler-ext", &PostParams::default(), &current)
        .await
        .unwrap();
    pods.delete("db-0", &Default::default()).await.unwrap();
    wait_until("db-0 gone", || async {
        pods.get_opt("db-0").await.unwrap().is_none()
    })
    .await;
    let p = prod_pod("db-0", json!({})).await;
    assert_eq!(
        p.annotations()["ipkeep.dev/pinned-by"],
        "db",
        "pinned with the new certificate"
    );
}

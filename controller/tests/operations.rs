//! Operating the controller: generated CRD is current, leader election with two replicas, and
//! convergence through API faults, dropped watches and 410 Gone.
#![allow(clippy::unwrap_used)]

mod support;

use ipkeep_tests::faults::{Fault, Faults};
use ipkeep_values::keys;
use serde_json::json;
use support::*;

#[test]
fn committed_crd_yaml_is_current() {
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/ipkeep/files/crd.yaml"
    ))
    .unwrap();
    assert!(
        committed == ipkeep_controller::crd_yaml().unwrap(),
        "charts/ipkeep/files/crd.yaml is stale: run `cargo run -p ipkeep-controller \
         --bin crdgen > charts/ipkeep/files/crd.yaml && scripts/render-deploy.sh`"
    );
}

fn auto() -> std::collections::BTreeMap<String, String> {
    annotations(&[
        (keys::AUTO_GENERATE, "true"),
        (keys::REQUIRED_TOPOLOGY, "kubernetes.io/hostname"),
    ])
}

async fn reporting_instances(client: &kube::Client) -> Vec<String> {
    events(client)
        .await
        .into_iter()
        .filter_map(|e| e.reporting_instance)
        .collect()
}

/// What kube-lease-manager does when two replicas find the Lease free at the same moment: each
/// applies itself as the holder, without force. The second must get 409 Conflict; it did not
/// while both replicas wrote as one field manager, and both led.
#[tokio::test]
async fn two_replicas_taking_a_free_lease_at_once_do_not_both_win() {
    use ipkeep_controller::leader::field_manager;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, Patch, PatchParams};
    let Some(c) = cluster().await else { return };
    let leases: Api<Lease> = Api::default_namespaced(c.client.clone());
    let take = |holder: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "ipkeep-controller"},
               "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}})
    };
    leases
        .patch(
            "ipkeep-controller",
            &PatchParams::apply(&field_manager("replica-a")),
            &Patch::Apply(take("replica-a")),
        )
        .await
        .unwrap();
    let second = leases
        .patch(
            "ipkeep-controller",
            &PatchParams::apply(&field_manager("replica-b")),
            &Patch::Apply(take("replica-b")),
        )
        .await;
    match second {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("replica-b took a Lease replica-a had just taken: {other:?}"),
    }
    let lease = leases.get("ipkeep-controller").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("replica-a")
    );
}

/// Watches open on kube-apiserver, by resource (`apiserver_longrunning_requests`).
fn open_watches(c: &Cluster) -> std::collections::BTreeMap<String, i64> {
    let metrics = c.server.kubectl().run(&["get", "--raw", "/metrics"]);
    let mut by_resource = std::collections::BTreeMap::new();
    for line in metrics.lines().filter(|l| {
        l.starts_with("apiserver_longrunning_requests{") && l.contains(r#"verb="WATCH""#)
    }) {
        let resource = line.split(r#"resource=""#).nth(1).unwrap();
        let resource = resource.split('"').next().unwrap().to_string();
        let count: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        *by_resource.entry(resource).or_default() += count as i64;
    }
    by_resource
}

/// However many loops read a kind, the controller watches it once: PersistentPodStates,
/// StatefulSets, StatefulSet pods, nodes and namespaces.
#[tokio::test]
async fn one_watch_per_kind() {
    let Some(c) = cluster().await else { return };
    let before = open_watches(&c);
    let ctl = start_controller(&c.client, None, "c1");
    let expected: std::collections::BTreeMap<String, i64> = [
        "namespaces",
        "nodes",
        "persistentpodstates",
        "pods",
        "statefulsets",
    ]
    .into_iter()
    .map(|r| (r.to_string(), 1))
    .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let opened: std::collections::BTreeMap<String, i64> = open_watches(&c)
            .into_iter()
            .map(|(r, n)| (r.clone(), n - before.get(&r).copied().unwrap_or(0)))
            .filter(|(_, n)| *n != 0)
            .collect();
        if opened == expected {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the controller's watches by resource: {opened:?}, expected {expected:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn only_the_leader_writes_and_the_standby_takes_over() {
    let Some(c) = cluster().await else { return };
    let a = start_controller(&c.client, Some(leader(&c.ns, "replica-a")), "replica-a");
    eventually("a leads", || async {
        (a.health.metrics.leader.get() == 1).then_some(())
    })
    .await;
    let b = start_controller(&c.client, Some(leader(&c.ns, "replica-b")), "replica-b");
    eventually("b is ready as a standby", || async {
        b.health
            .ready
            .load(std::sync::atomic::Ordering::Acquire)
            .then_some(())
    })
    .await;

    let sts = create_sts(&c.client, "pg", 2, 0, &auto()).await;
    run_pod(&c.client, &sts, 0, "n1", "10.8.0.1").await;
    wait_pps(&c.client, "pg", "recorded by the leader", |p| {
        records(p).len() == 1
    })
    .await;
    assert_eq!(b.health.metrics.leader.get(), 0);
    // Its series exist from the start, at zero; none may have counted.
    let standby = b.health.metrics.encode();
    assert!(
        (standby.lines())
            .filter(|l| l.starts_with("ipkeep_controller_reconciles_total{"))
            .all(|l| l.ends_with(" 0")),
        "the standby reconciled:\n{standby}"
    );
    let instances = reporting_instances(&c.client).await;
    assert!(
        !instances.is_empty() && instances.iter().all(|i| i == "replica-a"),
        "{instances:?}"
    );

    // The leader stops (SIGTERM): it releases the lease and the standby takes over.
    a.stop().await.unwrap();
    eventually("b leads", || async {
        (b.health.metrics.leader.get() == 1).then_some(())
    })
    .await;
    run_pod(&c.client, &sts, 1, "n2", "10.8.0.2").await;
    wait_pps(&c.client, "pg", "recorded by the new leader", |p| {
        records(p).len() == 2
    })
    .await;
    let text = b.health.metrics.encode();
    assert!(
        (text.lines()).any(|l| l
            .strip_prefix("ipkeep_controller_reconciles_total{controller=\"record\"} ")
            .is_some_and(|n| n != "0")),
        "the new leader did not reconcile:\n{text}"
    );
    b.stop().await.unwrap();
}

#[tokio::test]
async fn converges_through_api_errors_conflicts_throttling_and_lost_watches() {
    let Some(c) = cluster().await else { return };
    // The controller's client answers what the faults script before the real server does.
    let faults = Faults::default();
    let ctl = start_controller(&c.client_with(&faults).await, None, "solo");
    let sts = create_sts(&c.client, "kv", 4, 0, &auto()).await;
    wait_pps(&c.client, "kv", "generated", |_| true).await;
    faults.inject(Fault::new("patch", "persistentpodstates/status", 2, 500));
    faults.inject(Fault::new("patch", "persistentpodstates/status", 2, 409));
    faults.inject(Fault::new("patch", "persistentpodstates/status", 1, 429).retry_after(1));
    for (i, node) in [(0, "n1"), (1, "n2")] {
        run_pod(&c.client, &sts, i, node, &format!("10.9.0.{i}")).await;
    }
    wait_pps(&c.client, "kv", "recorded despite failed writes", |p| {
        records(p).len() == 2
    })
    .await;
    assert_eq!(faults.pending(), 0);

    // Lose every watch and the history behind them: the next watches get 410 Gone and relist.
    // Meanwhile pods change: kv-2 becomes Ready, and the StatefulSet scales to 3 with kv-3 gone.
    faults.drop_watches();
    run_pod(&c.client, &sts, 2, "n3", "10.9.0.2").await;
    run_pod(&c.client, &sts, 3, "n3", "10.9.0.3").await;
    faults.expire_watches();
    faults.drop_watches();
    wait_pps(&c.client, "kv", "four records", |p| records(p).len() == 4).await;
    faults.inject(Fault::new("list", "pods", 2, 503));
    faults.drop_watches();
    patch_sts(&c.client, "kv", json!({"spec": {"replicas": 3}})).await;
    remove_pod(&c.client, "kv-3").await;
    faults.expire_watches();
    faults.drop_watches();
    // Every watcher has now failed several times within seconds, so kube-runtime's default
    // backoff (exponential, up to 30 s, reset after 2 min) may delay the last relist well past
    // the usual wait; the test asserts convergence, not its speed.
    let pps = wait_pps_within(
        &c.client,
        "kv",
        "kv-3 pruned after the relist",
        std::time::Duration::from_secs(90),
        |p| records(p).len() == 3,
    )
    .await;
    assert_eq!(
        placements(&pps),
        vec![
            ("kv-0".into(), "n1".into()),
            ("kv-1".into(), "n2".into()),
            ("kv-2".into(), "n3".into())
        ]
    );
    let text = ctl.health.metrics.encode();
    for kind in ["server", "conflict"] {
        assert!(
            text.contains(&format!(
                "ipkeep_controller_reconcile_errors_total{{controller=\"record\",error=\"{kind}\"}}"
            )),
            "{kind}:\n{text}"
        );
    }
    ctl.stop().await.unwrap();
}

#[tokio::test]
async fn health_and_metrics_endpoints() {
    use tower::ServiceExt;
    let Some(c) = cluster().await else { return };
    let ctl = start_controller(&c.client, None, "solo");
    let sts = create_sts(&c.client, "m", 1, 0, &auto()).await;
    run_pod(&c.client, &sts, 0, "n1", "10.10.0.1").await;
    wait_pps(&c.client, "m", "recorded", |p| records(p).len() == 1).await;
    let router = ipkeep_controller::http::router(ctl.health.clone());
    let get = |path: &'static str| {
        let router = router.clone();
        async move {
            let res = router
                .oneshot(
                    axum::http::Request::get(path)
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            let status = res.status();
            let body = http_body_util::BodyExt::collect(res.into_body())
                .await
                .unwrap()
                .to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    assert_eq!(get("/healthz").await.0, 200);
    eventually("ready", || async {
        (get("/readyz").await.0 == 200).then_some(())
    })
    .await;
    let (status, text) = get("/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "ipkeep_controller_records 1",
        "ipkeep_controller_records_written_total 1",
        "ipkeep_controller_leader 1",
        "ipkeep_controller_reconcile_duration_seconds_count{controller=\"record\"}",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    ctl.stop().await.unwrap();
}

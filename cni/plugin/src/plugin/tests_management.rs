//! ADD and DEL decided by who manages the pod: the node agent's view of the API server when a
//! command runs in the agent (given here as a fixed answer: the agent's own decision is tested
//! in `ipkeep-agent`), the pod's annotations without it; and a full range's reclaim order
//! through the whole command (the security review's L-1, `exhaust2.py` (c)).

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use ipkeep_ipam::StoreRead;

use super::tests::{ALONE, at, dir, ip_of, logged};
use super::*;
use crate::management::{Management, NoApiView, Unavailable};
use crate::netconf;
use crate::stores::MemoryStores;

/// What the agent would answer, fixed.
#[derive(Debug)]
struct Says(Management);

impl ApiView for Says {
    fn management(&self, _: &crate::management::SandboxPod<'_>) -> Management {
        self.0.clone()
    }
}

fn conf(annotations: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"net","runtimeConfig":{{"io.kubernetes.cri.pod-annotations":{{{annotations}}}}},"ipam":{{"dataDir":"/var/lib/cni/test","ranges":[[{{"subnet":"10.6.0.0/29"}}]]}}}}"#
    )
}

fn vars(command: &str, cid: &str, namespace: &str, pod: &str) -> HashMap<String, String> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", cid),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/run/netns/none"),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([(
        "CNI_ARGS".to_string(),
        format!("K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod}"),
    )])
    .collect()
}

/// Runs one command for `namespace/pod` with `annotations`, the agent saying `api`.
fn run_as(
    stores: &MemoryStores,
    api: &dyn ApiView,
    command: &str,
    cid: &str,
    (namespace, pod): (&str, &str),
    annotations: &str,
) -> String {
    let config = netconf::decode(conf(annotations).as_bytes());
    let call = Call {
        api,
        ..at(1_000, 10)
    };
    let done = run(stores, &vars(command, cid, namespace, pod), &config, &call);
    let out = String::from_utf8(done.stdout).unwrap();
    assert_eq!(done.exit_code, 0, "{command} {cid}: {out}");
    out
}

fn managed_by_db() -> Says {
    Says(Management::Managed {
        persistent_pod_state: "db".into(),
        annotations: [
            ("ipkeep.dev/persistent-pod-state", "db"),
            ("ipkeep.dev/ip-retention", "2h"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
        judged_by_name: false,
    })
}

fn held(stores: &MemoryStores) -> Vec<ipkeep_ipam::Lease> {
    stores.get(&dir()).unwrap().held().unwrap()
}

/// A pod created before its PersistentPodState existed carries no annotation at all. Alone,
/// the plugin frees its address at DEL; through an agent that sees the state manage it, the
/// address is held for the state's retention, recorded as confirmed.
#[test]
fn a_pod_the_api_says_is_managed_is_held_without_any_annotation() {
    let pod = ("prod", "db-0");
    let stores = MemoryStores::default();
    run_as(&stores, &ALONE, "ADD", "a", pod, "");
    run_as(&stores, &ALONE, "DEL", "a", pod, "");
    assert!(held(&stores).is_empty(), "alone: today's rules");

    let says = managed_by_db();
    let text = logged("info", || {
        run_as(&stores, &says, "ADD", "b", pod, "");
        run_as(&stores, &says, "DEL", "b", pod, "");
    });
    let leases = held(&stores);
    assert_eq!(leases.len(), 1, "{text}");
    let lease = &leases[0];
    assert_eq!(lease.retention, Retention::Seconds(7_200));
    assert_eq!(
        lease.pod.as_ref().unwrap().confirmed_manager(),
        Some("db"),
        "{lease:?}"
    );
    assert!(
        text.contains("PersistentPodState db manages this pod")
            && text.contains("holding the address for the pod")
            && text.contains("confirmed=true"),
        "{text}"
    );
}

/// A link the pod's author wrote, to a state that does not manage it, counts for nothing once
/// the agent can say so: `ipam.maxUnmanagedRetention` (0) applies, the log names the link.
#[test]
fn a_forged_link_counts_for_nothing_when_the_api_says_unmanaged() {
    let forged = r#""ipkeep.dev/persistent-pod-state":"db","ipkeep.dev/ip-retention":"forever""#;
    let pod = ("prod", "squat-0");
    let stores = MemoryStores::default();
    run_as(&stores, &ALONE, "ADD", "a", pod, forged);
    run_as(&stores, &ALONE, "DEL", "a", pod, forged);
    assert_eq!(held(&stores).len(), 1, "alone, the link is believed");

    let stores = MemoryStores::default();
    let says = Says(Management::Unmanaged);
    let text = logged("warn", || {
        run_as(&stores, &says, "ADD", "b", pod, forged);
        run_as(&stores, &says, "DEL", "b", pod, forged);
    });
    assert!(held(&stores).is_empty(), "{text}");
    assert!(
        text.contains(r#"annotation names "db", but no PersistentPodState manages this pod"#)
            && text.contains("limited to ipam.maxUnmanagedRetention 0"),
        "{text}"
    );
}

/// The security review's L-2 through whole commands: db-7 of StatefulSet `db` is deleted and
/// its address held. A pod someone else names db-7, which the agent says nothing manages, gets
/// another address (the log says why) and its DEL frees only that; the StatefulSet's db-7 gets
/// its address back.
#[test]
fn a_pod_the_api_says_is_unmanaged_does_not_get_a_states_holding() {
    let pod = ("prod", "db-7");
    let stores = MemoryStores::default();
    let db = managed_by_db();
    let kept = ip_of(&run_as(&stores, &db, "ADD", "sts-a", pod, ""));
    run_as(&stores, &db, "DEL", "sts-a", pod, "");
    let nobody = Says(Management::Unmanaged);
    let (got, text) = {
        let mut got = String::new();
        let text = logged("warn", || {
            got = ip_of(&run_as(&stores, &nobody, "ADD", "evil", pod, ""));
            run_as(&stores, &nobody, "DEL", "evil", pod, "");
        });
        (got, text)
    };
    assert_ne!(got, kept, "the unmanaged db-7 got db's holding");
    let kept_ip = kept.split('/').next().unwrap();
    assert!(
        text.contains(&format!(
            "{kept_ip} is kept under this pod's name for the pod of PersistentPodState db, which does not manage this pod"
        )),
        "{text}"
    );
    let leases = held(&stores);
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].ip.to_string(), kept_ip);
    let back = ip_of(&run_as(&stores, &db, "ADD", "sts-b", pod, ""));
    assert_eq!(back, kept);
}

/// Without the agent's view the annotations decide as they always did, and the log says the
/// view was missing: a warning when an agent should have answered.
#[test]
fn without_a_view_the_annotations_decide_and_the_log_says_so() {
    let stamped = r#""ipkeep.dev/persistent-pod-state":"db","ipkeep.dev/ip-retention":"1h""#;
    let pod = ("prod", "db-1");
    let stores = MemoryStores::default();
    let down = NoApiView(Unavailable {
        why: "the node agent did not serve the command: connection refused".into(),
        expected: true,
    });
    let text = logged("warn", || {
        run_as(&stores, &down, "ADD", "a", pod, stamped);
        run_as(&stores, &down, "DEL", "a", pod, stamped);
    });
    let leases = held(&stores);
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].retention, Retention::Seconds(3_600));
    let pod_ref = leases[0].pod.as_ref().unwrap();
    assert_eq!(
        (pod_ref.persistent_pod_state.as_deref(), pod_ref.confirmed),
        (Some("db"), false),
        "recorded, unconfirmed"
    );
    assert_eq!(
        text.matches("no view of the API server").count(),
        2,
        "ADD and DEL say it: {text}"
    );
    assert!(text.contains("connection refused"), "{text}");
}

/// `exhaust2.py` (c) through whole commands, the plugin alone: db-0 of `prod` (link, 1 h) is
/// held; five pods of `evil` with a forged link and `forever` come and go on a /29; a sixth new
/// pod needs an address. db-0's holding must not be the one that gives way, and db-0's rebuild
/// gets its address back. (Before: the fifth forged pod already took db-0's address.)
#[test]
fn forged_forever_holdings_give_way_before_a_real_one() {
    let stores = MemoryStores::default();
    let real = r#""ipkeep.dev/persistent-pod-state":"db","ipkeep.dev/ip-retention":"1h""#;
    let forged =
        r#""ipkeep.dev/persistent-pod-state":"anything","ipkeep.dev/ip-retention":"forever""#;
    let db0 = ip_of(&run_as(
        &stores,
        &ALONE,
        "ADD",
        "db0-a",
        ("prod", "db-0"),
        real,
    ));
    run_as(&stores, &ALONE, "DEL", "db0-a", ("prod", "db-0"), real);
    for i in 0..5 {
        let (cid, name) = (format!("e{i}"), format!("p{i}"));
        run_as(&stores, &ALONE, "ADD", &cid, ("evil", &name), forged);
        run_as(&stores, &ALONE, "DEL", &cid, ("evil", &name), forged);
    }
    let new = ip_of(&run_as(&stores, &ALONE, "ADD", "n1", ("evil", "new1"), ""));
    assert_ne!(new, db0, "the new pod took db-0's held address");
    let back = ip_of(&run_as(
        &stores,
        &ALONE,
        "ADD",
        "db0-b",
        ("prod", "db-0"),
        real,
    ));
    assert_eq!(back, db0, "db-0's rebuild gets its address back");
}

/// DEL resolves the retention as ADD does, adjustments included, with the same warning: an
/// unlinked pod asking `forever` gets `ipam.maxUnmanagedRetention` at each, as the network says
/// it at that moment.
#[test]
fn del_resolves_the_retention_as_add_does() {
    let net = |max: &str| {
        format!(
            r#"{{"cniVersion":"1.0.0","name":"net","runtimeConfig":{{"io.kubernetes.cri.pod-annotations":{{"ipkeep.dev/ip-retention":"forever"}}}},"ipam":{{"dataDir":"/var/lib/cni/test","maxUnmanagedRetention":"{max}","ranges":[[{{"subnet":"10.6.0.0/29"}}]]}}}}"#
        )
    };
    let stores = MemoryStores::default();
    let alone = NoApiView::new("the plugin runs without the node agent", false);
    let call = Call {
        api: &alone,
        ..at(1_000, 10)
    };
    let invoke = |command: &str, conf: &str| {
        let config = netconf::decode(conf.as_bytes());
        let done = run(
            &stores,
            &vars(command, "a", "prod", "web-0"),
            &config,
            &call,
        );
        assert_eq!(
            done.exit_code,
            0,
            "{command}: {}",
            String::from_utf8_lossy(&done.stdout)
        );
    };
    let text = logged("warn", || {
        invoke("ADD", &net("1h"));
        invoke("DEL", &net("2h"));
    });
    let leases = held(&stores);
    assert_eq!(leases.len(), 1);
    assert_eq!(
        leases[0].retention,
        Retention::Seconds(7_200),
        "DEL's own resolution decides, not the 1 h recorded at ADD"
    );
    assert_eq!(
        text.matches("maxUnmanagedRetention").count(),
        2,
        "ADD and DEL warn alike: {text}"
    );
}

/// A DEL while the agent's view is syncing (the agent just started, or a watch relists) must
/// not free the address of a pod the webhook did not stamp: its annotations say nothing, but a
/// PersistentPodState may manage it. The addresses stay with the sandbox, the log says the DEL
/// was deferred, and the DEL the agent applies once synced holds it for the state.
#[test]
fn a_del_while_the_agents_view_syncs_leaves_the_address_to_the_synced_view() {
    let pod = ("prod", "db-0");
    let stores = MemoryStores::default();
    let db = managed_by_db();
    let ip = ip_of(&run_as(&stores, &db, "ADD", "a", pod, ""));
    let syncing = Says(Management::Syncing(Unavailable {
        why: "the node agent's view of the API server is not usable (syncing)".into(),
        expected: true,
    }));
    let text = logged("warn", || {
        run_as(&stores, &syncing, "DEL", "a", pod, "");
    });
    let leases = stores.get(&dir()).unwrap().all().unwrap();
    assert_eq!(leases.len(), 1, "the DEL freed the address: {text}");
    assert!(leases[0].is_active(), "{:?}", leases[0]);
    assert_eq!(leases[0].ip.to_string(), ip.split('/').next().unwrap());
    assert!(
        text.contains("DEL deferred") && text.contains("(syncing)"),
        "{text}"
    );
    // ADD follows the annotations meanwhile, as without a view: a new pod gets a new address.
    let other = ip_of(&run_as(
        &stores,
        &syncing,
        "ADD",
        "b",
        ("prod", "web-0"),
        "",
    ));
    assert_ne!(other, ip);
}

//! Writing a large ipkeep store directly (not through the plugin), for tests and benchmarks
//! that need tens of thousands of leases in seconds.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use ipkeep_ipam::store::LeaseChange;
use ipkeep_ipam::{
    Attachment, Commit, DiskStore, Lease, LeaseState, NetworkDir, PodRef, Retention, Store,
};

/// The `i`-th address after `first`.
pub fn nth_ip(first: Ipv4Addr, i: usize) -> IpAddr {
    let offset = u32::try_from(i).expect("the index fits an IPv4 offset");
    IpAddr::V4(Ipv4Addr::from(u32::from(first) + offset))
}

/// The address of a deleted pod `kv-<i>` of PersistentPodState `kv` in namespace `ns`, held
/// forever, with a 64-hex-digit sandbox ID as real runtimes use.
pub fn held_lease(ip: IpAddr, i: usize, ns: &str, since: u64) -> Lease {
    Lease {
        ip,
        owner: Attachment {
            container_id: format!("{:064x}", 0xabcd_ef00_0000_u64 + i as u64),
            ifname: "eth0".into(),
        },
        pod: Some(PodRef {
            namespace: ns.into(),
            name: format!("kv-{i}"),
            uid: Some(format!("uid-{i:06}")),
            persistent_pod_state: Some("kv".into()),
            persistent_pod_state_uid: None,
            confirmed: true,
        }),
        retention: Retention::Forever,
        state: LeaseState::Held { until: None },
        since,
        netns: None,
    }
}

/// Writes `leases` into the store of `network` under `data_dir` in commits of `chunk`; the last
/// commit also gets what `last` adds (a cursor, the range sets).
pub fn write(
    data_dir: &Path,
    network: &str,
    leases: Vec<Lease>,
    chunk: usize,
    last: impl FnOnce(&mut Commit),
) {
    let lock = NetworkDir::new(data_dir, network)
        .expect("network name")
        .lock(Duration::from_secs(30))
        .expect("lock the network");
    let mut store = DiskStore::open(lock, &Default::default()).expect("open the store");
    let mut commits: Vec<Commit> = leases
        .chunks(chunk.max(1))
        .map(|c| Commit {
            leases: c
                .iter()
                .map(|l| LeaseChange {
                    ip: l.ip,
                    before: None,
                    after: Some(l.clone()),
                })
                .collect(),
            ..Commit::default()
        })
        .collect();
    if let Some(c) = commits.last_mut() {
        last(c);
    }
    for c in commits {
        store.commit(c).expect("commit");
    }
}

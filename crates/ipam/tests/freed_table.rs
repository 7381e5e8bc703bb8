//! The reuse-cooldown table of a real store (redb on disk) stays small however many pods come
//! and go: entries past the cooldown are forgotten by the next ADD, and the table never holds
//! more than `MAX_FREED_REMEMBERED` (the oldest go first).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use ipkeep_ipam::range::{RangeSet, RangeSpec};
use ipkeep_ipam::store::MAX_FREED_REMEMBERED;
use ipkeep_ipam::{
    AddRequest, Attachment, Commit, Departure, DiskStore, NetworkDir, Reading, Retention, Store,
    StoreRead, allocator,
};
use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};

const FREED: TableDefinition<&[u8], u64> = TableDefinition::new("freed");

fn open(data: &Path) -> DiskStore {
    let lock = NetworkDir::new(data, "v6")
        .unwrap()
        .lock(Duration::from_secs(5))
        .unwrap();
    DiskStore::open(lock, &Default::default()).unwrap()
}

/// How many freed addresses the store remembers (read with redb itself, the store closed).
fn remembered(data: &Path) -> u64 {
    let db = redb::Database::open(data.join("v6/leases.redb")).unwrap();
    let txn = db.begin_read().unwrap();
    txn.open_table(FREED).unwrap().len().unwrap()
}

fn v6_range() -> Vec<RangeSet> {
    vec![
        RangeSet::from_specs(&[RangeSpec {
            subnet: Some("fd00:10:244:1::/64".into()),
            ..RangeSpec::default()
        }])
        .unwrap(),
    ]
}

/// Found by review: on an IPv6 range every pod deletion left an entry for good (round robin
/// never comes back to the address): 220,000 deletions grew a store from 316 KiB to 9.5 MB.
#[test]
fn entries_past_the_cooldown_are_forgotten_by_the_next_add() {
    let data = tempfile::tempdir().unwrap();
    let sets = v6_range();
    let cooldown = 100;
    let mut store = open(data.path());
    let mut last = None;
    for i in 0..400u64 {
        let owner = Attachment {
            container_id: format!("c{i}"),
            ifname: "eth0".into(),
        };
        let req = AddRequest {
            range_sets: &sets,
            owner: owner.clone(),
            pod: None,
            retention: Retention::Off,
            requested: &[],
            netns: None,
            netns_known: BTreeMap::new(),
            reuse_cooldown: cooldown,
        };
        // One ADD and one DEL a second.
        let added = allocator::add(&mut store, &req, &Reading::wall(1_000_000 + i)).unwrap();
        last = Some(added.assignments[0].ip);
        allocator::del(
            &mut store,
            &owner,
            &Departure::default(),
            &Reading::wall(1_000_000 + i),
        )
        .unwrap();
    }
    // The address freed last is still cooling.
    assert_eq!(store.freed_at(last.unwrap()).unwrap(), Some(1_000_399));
    drop(store);
    let n = remembered(data.path());
    assert!(
        n <= cooldown + 1,
        "{n} entries remembered after 400 deletions, a {cooldown} s cooldown and one deletion a second"
    );
}

#[test]
fn the_table_is_bounded_and_forgets_the_oldest_first() {
    let data = tempfile::tempdir().unwrap();
    let ip = |i: usize| IpAddr::V6(Ipv6Addr::from(0xfd00_u128 << 112 | i as u128));
    let total = MAX_FREED_REMEMBERED + 500;
    let mut store = open(data.path());
    store
        .commit(Commit {
            freed: (0..total).map(|i| (ip(i), Some(i as u64))).collect(),
            ..Commit::default()
        })
        .unwrap();
    assert_eq!(store.freed_at(ip(0)).unwrap(), None, "the oldest went");
    assert_eq!(store.freed_at(ip(499)).unwrap(), None);
    assert_eq!(store.freed_at(ip(500)).unwrap(), Some(500));
    assert_eq!(
        store.freed_at(ip(total - 1)).unwrap(),
        Some(total as u64 - 1)
    );
    drop(store);
    assert_eq!(remembered(data.path()), MAX_FREED_REMEMBERED as u64);
}

//! Arbitrary bytes as an AdmissionReview (`/mutate-pods`) and as ExtenderArgs (`/filter`,
//! `/prioritize`), against caches holding a PersistentPodState with a record and a few nodes.
//! Any panic is a bug; every input must give a response or a clear error.
#![no_main]

use std::sync::OnceLock;

use ipkeep_scheduler_ext::cache::Caches;
use ipkeep_scheduler_ext::{extender, webhook};
use kube::runtime::watcher::Event;
use libfuzzer_sys::fuzz_target;

fn caches() -> &'static Caches {
    static CACHES: OnceLock<Caches> = OnceLock::new();
    CACHES.get_or_init(|| {
        let (caches, mut writers) = Caches::new(Default::default());
        let pps = serde_json::from_str(include_str!("../seeds/scheduler_ext_requests/pps.json"))
            .expect("seed PersistentPodState");
        writers.pps.apply_watcher_event(&Event::Init);
        writers.pps.apply_watcher_event(&Event::InitApply(pps));
        writers.pps.apply_watcher_event(&Event::InitDone);
        writers.nodes.apply_watcher_event(&Event::Init);
        for i in 0..4 {
            let node = serde_json::from_value(serde_json::json!({"metadata": {
                "name": format!("n{i}"),
                "labels": {"kubernetes.io/hostname": format!("n{i}"), "topology.kubernetes.io/zone": format!("z{}", i % 2)}
            }}))
            .expect("node");
            writers.nodes.apply_watcher_event(&Event::InitApply(node));
        }
        writers.nodes.apply_watcher_event(&Event::InitDone);
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(caches.wait_until_ready());
        assert!(caches.ready());
        caches
    })
}

fuzz_target!(|data: &[u8]| {
    let caches = caches();
    let _ = webhook::review(data, caches);
    let _ = extender::filter(data, caches);
    let _ = extender::prioritize(data, caches);
});

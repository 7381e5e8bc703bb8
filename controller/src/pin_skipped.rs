//! `PinSkipped` Events: a Warning on the PersistentPodState, naming the pod, when a pod of its
//! StatefulSet carries `ipkeep.dev/pin-skipped` (the webhook's mark for a recorded pin the pod's
//! own constraints exclude, or a spec that cannot be acted on).
//!
//! The webhook only marks the pod: its requests are not authenticated, so what an
//! AdmissionReview claims may not exist. The controller sees the pods that do exist (its pod
//! watch) and the PersistentPodStates that do, so the Event is published here, once per pod UID.
//! A pod first seen more than [`ANNOUNCE_WITHIN`] after its creation is not announced: after a
//! restart or a failover its Event was published already, and its annotation still says why.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipkeep_placement::view::PodView;
use ipkeep_values::keys::PIN_SKIPPED;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::debug;

use crate::caches::CachedPod;
use crate::context::Context;
use crate::{pending, record};

/// Pods are announced only this long after their creation.
pub const ANNOUNCE_WITHIN: Duration = Duration::from_secs(10 * 60);

fn window_ms() -> i64 {
    i64::try_from(ANNOUNCE_WITHIN.as_millis()).unwrap_or(i64::MAX)
}

/// Whether `pod` carries the mark and is young enough to be announced at `now_ms`.
pub fn worth_announcing(pod: &PodView, now_ms: i64) -> bool {
    pod.annotations.contains_key(PIN_SKIPPED)
        && pod
            .created_ms
            .is_none_or(|created| now_ms.saturating_sub(created) <= window_ms())
}

/// The pods announced so far (only those still young enough to be seen again).
#[derive(Debug, Default)]
pub struct Announced {
    uids: HashMap<String, Option<i64>>,
}

impl Announced {
    /// Whether `pod` is to be announced now; if so, it never is again.
    pub fn first_time(&mut self, pod: &PodView, now_ms: i64) -> bool {
        self.uids
            .retain(|_, created| created.is_none_or(|c| now_ms.saturating_sub(c) <= window_ms()));
        worth_announcing(pod, now_ms)
            && !pod.uid.is_empty()
            && self.uids.insert(pod.uid.clone(), pod.created_ms).is_none()
    }
}

fn now_ms() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_millisecond()
}

/// The pod the watch passes on to [`announce`]: one worth announcing now.
pub fn to_announce(pod: &CachedPod) -> Option<ObjectRef<CachedPod>> {
    worth_announcing(&PodView::from(pod), now_ms()).then(|| ObjectRef::from_obj(pod))
}

/// Publishes a `PinSkipped` Event for each pod received that is still cached (so it exists),
/// once per pod UID, until `stop` resolves.
pub async fn announce(
    ctx: Arc<Context>,
    pods: pending::Receiver<ObjectRef<CachedPod>>,
    stop: impl Future<Output = ()>,
) {
    if ctx.caches.wait_until_ready().await.is_err() {
        return;
    }
    let mut pods = std::pin::pin!(pods.keys().take_until(stop));
    let mut announced = Announced::default();
    while let Some(reference) = pods.next().await {
        // Only a pod that exists now, as it is now.
        let Some(pod) = ctx.caches.pods.get(&reference) else {
            continue;
        };
        let view = PodView::from(pod.as_ref());
        if !announced.first_time(&view, now_ms()) {
            continue;
        }
        let why = view.annotations.get(PIN_SKIPPED).map_or("", String::as_str);
        for reference in ctx.caches.pps_for_pod(&pod) {
            let Some(pps) = ctx.caches.pps.get(&reference) else {
                continue;
            };
            debug!(pod = ?view.name, pps = ?pps.name_any(), "announcing a skipped pin");
            let note = format!("pod {} (uid {}) {why}", view.name, view.uid);
            ctx.publish(
                &pps.object_ref(&()),
                record::ACTION,
                EventType::Warning,
                "PinSkipped",
                &note,
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, created_ms: Option<i64>, marked: bool) -> PodView {
        let mut annotations = std::collections::BTreeMap::new();
        if marked {
            annotations.insert(PIN_SKIPPED.to_string(), "not pinned, because …".to_string());
        }
        PodView {
            name: "db-0".into(),
            uid: uid.into(),
            annotations,
            created_ms,
            ..PodView::default()
        }
    }

    #[test]
    fn once_per_uid_and_only_while_young() {
        let window = window_ms();
        let mut a = Announced::default();
        assert!(a.first_time(&pod("u1", Some(1_000), true), 2_000));
        assert!(!a.first_time(&pod("u1", Some(1_000), true), 3_000), "once");
        assert!(
            a.first_time(&pod("u2", Some(1_000), true), 3_000),
            "a new pod of the same name"
        );
        assert!(
            !a.first_time(&pod("u3", Some(1_000), false), 3_000),
            "not marked"
        );
        assert!(
            !a.first_time(&pod("u4", Some(1_000), true), 1_001 + window),
            "too old: announced before a restart"
        );
        assert!(a.first_time(&pod("u5", None, true), 1_000), "age unknown");
        assert!(!a.first_time(&pod("", Some(1_000), true), 1_000), "no uid");
        // Remembered only while young enough to be seen again.
        assert!(a.first_time(&pod("u6", Some(5_000 + window), true), 5_000 + window));
        assert_eq!(a.uids.len(), 2, "{:?}", a.uids.keys());
    }
}

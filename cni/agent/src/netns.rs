//! What the agent can say about sandboxes' network namespaces, which it looks up in its own
//! mount namespace, not the container runtime's.
//!
//! An address still configured in an older sandbox of a pod goes to the pod's new sandbox only
//! once the old sandbox's namespace (the `CNI_NETNS` path of its ADD) is gone, and the sweep
//! applies a DEL that never came only to a sandbox whose namespace is gone. A plugin process
//! runs on the host and sees the runtime's paths; the agent sees them only where the directory
//! is mounted into its container from the host. Elsewhere (a runtime that keeps namespaces in
//! another directory, `/proc/<pid>/ns/net` without the host's PID namespace, a mount that does
//! not propagate) every namespace would look gone to it, live ones included.
//!
//! So the agent trusts "gone" only in a directory it has *seen* as the runtime does: one in
//! which a namespace the runtime created was visible to it (the new sandbox of an ADD, which the
//! runtime creates just before calling the plugin, or a live sandbox recorded in a store),
//! and which is still the same directory (device and inode) when it is asked. Anything else is
//! [`Sighting::Unknown`]: an ADD that would move such an address asks the plugin, which runs on
//! the host, whether the namespace exists (see `ipkeep_cni::proto`), and the sweep leaves such an
//! address alone.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use ipkeep_ipam::StoreRead;

/// What the agent can tell about one network namespace path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sighting {
    /// The path exists: the sandbox may still be alive.
    Exists,
    /// The path is gone from a directory the agent sees as the runtime does.
    Gone,
    /// The path is not there, but the agent cannot vouch for its directory.
    Unknown,
}

/// The directories where the agent has seen the runtime's namespaces, by path, with the
/// directory's identity when it did.
#[derive(Debug, Default)]
pub struct NetnsView {
    seen: Mutex<BTreeMap<PathBuf, (u64, u64)>>,
    /// Directories already reported as not visible (each is said once until seen).
    reported: Mutex<BTreeSet<PathBuf>>,
}

/// `/proc/<pid>/…` names a process of the runtime's PID namespace, which is not the agent's.
fn names_a_process(path: &Path) -> bool {
    path.starts_with("/proc")
}

fn identity(dir: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(dir)
        .ok()
        .filter(std::fs::Metadata::is_dir)
        .map(|m| (m.dev(), m.ino()))
}

impl NetnsView {
    /// What the agent can tell about the namespace at `path` (records nothing).
    pub fn look(&self, path: &str) -> Sighting {
        let path = Path::new(path);
        if !path.is_absolute() || names_a_process(path) {
            return Sighting::Unknown;
        }
        if std::fs::symlink_metadata(path).is_ok() {
            return Sighting::Exists;
        }
        match path.parent() {
            Some(dir) if self.vouches_for(dir) => Sighting::Gone,
            _ => Sighting::Unknown,
        }
    }

    /// Whether the namespace at `path` may still exist: anything but a namespace the agent saw
    /// go. The answer for decisions that would free or move an address.
    pub fn may_exist(&self, path: &str) -> bool {
        self.look(path) != Sighting::Gone
    }

    /// Notes the namespace of a sandbox the runtime just created (`CNI_NETNS` of an ADD), or of
    /// one it recorded as live: if the agent sees it, it sees that directory as the runtime
    /// does; if it does not see a new sandbox's, it does not (said once, at WARN). Returns
    /// whether it was visible.
    pub fn note(&self, path: &str, new_sandbox: bool) -> bool {
        let path = Path::new(path);
        let Some(dir) = path.parent().filter(|_| path.is_absolute()) else {
            return false;
        };
        if names_a_process(path) {
            return false;
        }
        let visible = std::fs::symlink_metadata(path).is_ok();
        match identity(dir).filter(|_| visible) {
            Some(id) => {
                let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
                if seen.insert(dir.to_path_buf(), id) != Some(id) {
                    tracing::info!(dir = %dir.display(), "the agent sees the container runtime's network namespaces in this directory");
                }
                self.reported
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(dir);
            }
            None if new_sandbox => {
                self.seen
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(dir);
                let first = self
                    .reported
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(dir.to_path_buf());
                if first {
                    tracing::warn!(netns = %path.display(), dir = %dir.display(), hint = "mount that directory from the host into the agent at the same path, with mountPropagation HostToContainer (docs/agent.md); until then, an ADD that would move an older sandbox's address asks the plugin (which runs on the host) whether that sandbox is gone, and the sweep applies no missed DEL there", "the agent cannot see the network namespace the container runtime just created");
                }
            }
            None => {}
        }
        visible
    }

    fn vouches_for(&self, dir: &Path) -> bool {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(dir)
            .is_some_and(|id| identity(dir).as_ref() == Some(id))
    }
}

/// How the sandboxes recorded in one directory looked at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DirSurvey {
    /// Sandboxes in use whose namespace is recorded in this directory.
    pub recorded: usize,
    /// Of those, how many the agent sees.
    pub visible: usize,
}

/// Looks, at start, at the namespace of every address in use in `snapshots` (one per open
/// store), so the directories the runtime uses are known before the first ADD, and says in the
/// log what the agent sees: a directory where none of the recorded namespaces is visible is not mounted
/// from the host (or every sandbox there is gone). Also says whether the usual directory,
/// `/var/run/netns`, exists at all.
pub fn survey<S: StoreRead>(
    view: &NetnsView,
    snapshots: impl IntoIterator<Item = S>,
) -> BTreeMap<PathBuf, DirSurvey> {
    let mut dirs: BTreeMap<PathBuf, DirSurvey> = BTreeMap::new();
    for snapshot in snapshots {
        let _ = snapshot.scan(&mut |lease| {
            let Some(netns) = lease.netns.as_deref().filter(|_| lease.is_active()) else {
                return Ok(());
            };
            let path = Path::new(netns);
            // One line for all of /proc: a directory per process says nothing more.
            let dir = if names_a_process(path) {
                Path::new("/proc")
            } else {
                let Some(dir) = path.parent() else {
                    return Ok(());
                };
                dir
            };
            let entry = dirs.entry(dir.to_path_buf()).or_default();
            entry.recorded += 1;
            if view.note(netns, false) {
                entry.visible += 1;
            }
            Ok(())
        });
    }
    for (dir, s) in &dirs {
        if names_a_process(dir) {
            tracing::info!(
                recorded = s.recorded,
                hint = "an ADD that would move their addresses asks the plugin, which runs on the host, and the sweep applies no missed DEL to them",
                "sandboxes recorded under /proc: the runtime's PID namespace, not the agent's"
            );
        } else if s.visible == 0 {
            tracing::warn!(dir = %dir.display(), recorded = s.recorded, hint = "if those sandboxes are alive, the directory is not mounted from the host (mount it at the same path with mountPropagation HostToContainer, docs/agent.md); until the agent sees one, an ADD that would move their addresses asks the plugin, which runs on the host, and the sweep applies no missed DEL there", "none of the network namespaces recorded in this directory is visible to the agent");
        } else {
            tracing::info!(dir = %dir.display(), recorded = s.recorded, visible = s.visible, "network namespaces recorded in this directory are visible to the agent");
        }
    }
    let usual = Path::new("/var/run/netns");
    if identity(usual).is_none() {
        tracing::warn!(dir = %usual.display(), hint = "mount it from the host (the DaemonSet does, docs/agent.md); without it every sandbox there is unknown to the agent, which asks the plugin on the host instead", "the runtime's usual network namespace directory is not there in the agent's container");
    }
    dirs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn gone_only_in_a_directory_where_a_namespace_was_seen() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("netns");
        std::fs::create_dir(&dir).unwrap();
        let (old, new) = (dir.join("cni-old"), dir.join("cni-new"));
        let (old, new) = (old.to_str().unwrap(), new.to_str().unwrap());
        let view = NetnsView::default();
        // Never seen: a missing namespace may be one the agent cannot see.
        assert_eq!(view.look(old), Sighting::Unknown);
        assert!(view.may_exist(old));
        // The runtime's new sandbox is visible: the directory is the runtime's.
        std::fs::write(new, "").unwrap();
        assert!(view.note(new, true));
        assert_eq!(view.look(old), Sighting::Gone);
        assert!(!view.may_exist(old));
        std::fs::write(old, "").unwrap();
        assert_eq!(view.look(old), Sighting::Exists);
        std::fs::remove_file(old).unwrap();
        // Another directory in its place (another device or inode): not vouched for.
        std::fs::rename(&dir, tmp.path().join("moved")).unwrap();
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(view.look(old), Sighting::Unknown);
        // Seen again through a new sandbox, then one the agent cannot see forgets it.
        std::fs::write(new, "").unwrap();
        assert!(view.note(new, true));
        assert_eq!(view.look(old), Sighting::Gone);
        std::fs::remove_file(new).unwrap();
        assert!(!view.note(new, true));
        assert_eq!(view.look(old), Sighting::Unknown);
    }

    #[test]
    fn process_paths_and_relative_paths_are_never_judged() {
        let view = NetnsView::default();
        let mine = format!("/proc/{}/ns/net", std::process::id());
        assert!(!view.note(&mine, true), "not the runtime's PID namespace");
        assert_eq!(view.look(&mine), Sighting::Unknown);
        assert_eq!(view.look("/proc/999999999/ns/net"), Sighting::Unknown);
        assert_eq!(view.look("relative/netns"), Sighting::Unknown);
    }
}

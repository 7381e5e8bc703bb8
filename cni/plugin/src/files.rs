//! The files the plugin opens by a path its configuration names, opened the careful way: a
//! configuration is not trusted to name a regular file, or to name it without a symlink.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The most of `ipam.resolvConf` that is read (real resolv.conf files are a few hundred bytes).
pub const MAX_RESOLV_CONF_BYTES: u64 = 64 * 1024;

/// Reads at most `limit` bytes of a regular file (never a device or FIFO, which could block or
/// never end). Longer files are refused.
pub fn read_regular(path: &Path, limit: u64) -> std::io::Result<String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    file.take(limit + 1).read_to_string(&mut text)?;
    if text.len() as u64 > limit {
        return Err(std::io::Error::other(format!("larger than {limit} bytes")));
    }
    Ok(text)
}

/// Opens `ipam.logFile` for appending: created 0600 if missing, never through a symlink, and
/// only if it is a regular file.
pub fn open_log(path: &Path) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Whether a sandbox's network namespace (the `CNI_NETNS` path of its ADD) still exists: the
/// bind mount the runtime made for it is removed when the sandbox is torn down.
pub fn netns_exists(path: &str) -> bool {
    Path::new(path).is_absolute() && std::fs::symlink_metadata(path).is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_bounded_regular_files_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let ok = tmp.path().join("resolv.conf");
        std::fs::write(&ok, "nameserver 10.0.0.10\n").unwrap();
        assert_eq!(read_regular(&ok, 100).unwrap(), "nameserver 10.0.0.10\n");
        assert!(read_regular(&ok, 5).is_err(), "too long");
        // Only a regular file is read: /dev/zero as resolvConf would never end.
        assert!(read_regular(Path::new("/dev/zero"), 100).is_err());
        assert!(read_regular(tmp.path(), 100).is_err(), "a directory");
    }

    #[test]
    fn the_log_file_is_never_opened_through_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::write(&target, "").unwrap();
        let link = tmp.path().join("link.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        // ipam.logFile is never reached through a symlink (root appends to it).
        assert!(open_log(&link).is_err());
        assert!(open_log(Path::new("/dev/null")).is_err());
        let log = tmp.path().join("ipkeep.log");
        open_log(&log).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn network_namespaces_exist_or_not() {
        let tmp = tempfile::tempdir().unwrap();
        let ns = tmp.path().join("cni-1234");
        assert!(!netns_exists(ns.to_str().unwrap()));
        std::fs::write(&ns, "").unwrap();
        assert!(netns_exists(ns.to_str().unwrap()));
        assert!(!netns_exists("relative/path"));
    }
}

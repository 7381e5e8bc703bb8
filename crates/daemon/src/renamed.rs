//! Flags and environment variables renamed in this release, still taken for one release under
//! their old names, with a warning that names the new one: `--listen` and `IPKEEP_LISTEN` of
//! ipkeep-controller (now `--probe-listen`) and of ipkeep-scheduler-ext (now
//! `--webhook-listen`). The old flag is a hidden clap alias; its variable is read here.

use std::ffi::OsString;
use std::str::FromStr;

/// An old variable whose value does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid {old}={value:?} (renamed {new}): {reason}")]
pub struct RenamedError {
    /// The old name.
    pub old: &'static str,
    /// The new name.
    pub new: &'static str,
    /// Its value.
    pub value: String,
    /// Why it does not parse.
    pub reason: String,
}

/// The value of environment variable `old`, renamed `new`, if set (and `new` is not: the new
/// name wins); logs that it is deprecated. Call after logging is set up.
pub fn env<T>(old: &'static str, new: &'static str) -> Result<Option<T>, RenamedError>
where
    T: FromStr,
    T::Err: std::fmt::Display,
{
    if std::env::var_os(new).is_some() {
        return Ok(None);
    }
    let Some(value) = std::env::var_os(old) else {
        return Ok(None);
    };
    let value = value.to_string_lossy().into_owned();
    tracing::warn!(
        "{old} is deprecated and will be removed in the next release: set {new} instead"
    );
    value.parse().map(Some).map_err(|e: T::Err| RenamedError {
        old,
        new,
        value,
        reason: e.to_string(),
    })
}

/// Logs a warning for each of `renamed` (`(old flag, new flag)`, as `--name`) that `args` use,
/// as `--old value` or `--old=value`. Call after logging is set up, with `std::env::args_os()`.
pub fn warn_flags(args: impl IntoIterator<Item = OsString>, renamed: &[(&str, &str)]) {
    for arg in args {
        let arg = arg.to_string_lossy();
        let name = arg.split_once('=').map_or(&*arg, |(name, _)| name);
        if let Some((old, new)) = renamed.iter().find(|(old, _)| *old == name) {
            tracing::warn!(
                "{old} is deprecated and will be removed in the next release: use {new} instead"
            );
        }
    }
}

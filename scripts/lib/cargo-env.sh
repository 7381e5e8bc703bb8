# Sourced by scripts that run cargo and may themselves be started by `cargo test`
# (scripts/lib/install.sh, scripts/build-plugin.sh).
#
# drop_test_cargo_env: unsets what cargo sets for a test process only (CARGO_PKG_*,
# CARGO_MANIFEST_*, CARGO_BIN_*, CARGO_CRATE_*, CARGO_PRIMARY_PACKAGE, CARGO_TARGET_TMPDIR),
# as tests/src/lib.rs does for its own builds. ring's build script tracks several of them
# (rerun-if-env-changed), so passing them on makes a build started from a test differ from one
# started from a shell: each rebuilds half the tree after the other (4-5 minutes in release).
drop_test_cargo_env() {
  local v
  for v in $(compgen -e); do
    case $v in
      CARGO_PKG_* | CARGO_MANIFEST_* | CARGO_BIN_* | CARGO_CRATE_* | CARGO_PRIMARY_PACKAGE | CARGO_TARGET_TMPDIR) unset "$v" ;;
    esac
  done
}

# Sourced by scripts that run cargo and may themselves be started by `cargo test`
# (scripts/lib/install.sh, scripts/build-plugin.sh, scripts/demo.sh).
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

# cargo_build LABEL CARGO-BUILD-ARGS...: `cargo build` showing how far it got (a first release
# build of the workspace takes minutes, and `--quiet` showed nothing meanwhile). On a terminal,
# cargo's own output (a "Compiling" line per crate and its progress bar); otherwise (a log, a
# pipe) no bar redrawn with carriage returns but a line every 15 s, `LABEL: 57/312 compiled, 60 s
# (now: ...)`, and at the end how many crates it compiled (scripts/lib/cargo-progress.py).
# Everything goes to stderr; the exit code is cargo's.
cargo_build() {
  local label=$1; shift
  if [ -t 2 ]; then
    cargo build "$@" >&2
    return
  fi
  # cargo writes nothing to stdout with the default message format; both go through the filter.
  CARGO_TERM_PROGRESS_WHEN=always CARGO_TERM_PROGRESS_WIDTH=100 CARGO_TERM_COLOR=never \
    cargo build "$@" 2>&1 | python3 "$(dirname "${BASH_SOURCE[0]}")/cargo-progress.py" "$label" >&2
  return "${PIPESTATUS[0]}"
}

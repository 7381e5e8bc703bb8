#!/usr/bin/env bash
# Builds the `ipkeep` CNI plugin statically linked (glibc's crt-static), and prints the path of
# the binary (last line).
#
#   scripts/build-plugin.sh [--profile release|dev]
#
# The plugin runs on the node, not in ipkeep's image: the container runtime executes it from
# /opt/cni/bin with the host's C library. A dynamically linked build needs a glibc at least as
# new as the one it was built against (Debian 12's 2.36), which older hosts (RHEL 8, Ubuntu
# 20.04) do not have; the static build runs on any Linux and starts faster (no dynamic
# loading: about 0.35 ms of every command, docs/benchmarks.md). The plugin resolves no names
# and loads no libraries, so static glibc's limits (NSS, dlopen) do not apply.
#
# Cargo applies target features to every crate it builds for the target, so the plugin is built
# for the host's target triple explicitly: build scripts and proc-macros are then built
# without the flag, and the result goes to target/<triple>/<profile>/ipkeep, apart from the
# dynamically linked binaries of target/<profile>/. The Dockerfile and scripts/images.py use it.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=${2:?--profile needs release or dev}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-plugin: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $profile in release) dir=release ;; dev) dir=debug ;; *) echo "build-plugin: --profile is release or dev" >&2; exit 2 ;; esac

triple=$(rustc -vV | sed -n 's/^host: //p')
[ -n "$triple" ] || { echo "build-plugin: cannot tell the host's target triple (rustc -vV)" >&2; exit 1; }
# Without the variables of a `cargo test` that runs this script (scripts/lib/cargo-env.sh).
# shellcheck source=scripts/lib/cargo-env.sh
. scripts/lib/cargo-env.sh
drop_test_cargo_env
RUSTFLAGS="-C target-feature=+crt-static" cargo_build "build-plugin: cargo build" --locked --profile "$profile" \
  --target "$triple" -p ipkeep-cni --bin ipkeep
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target_dir/$triple/$dir/ipkeep
if ldd "$bin" 2>/dev/null | grep -q '=>'; then
  echo "build-plugin: $bin is dynamically linked; expected a static binary" >&2
  exit 1
fi
echo "$bin"

#!/usr/bin/env bash
# Builds cargo-deny (which scripts/test.sh runs with deny.toml: licences, duplicate versions,
# sources) from crates.io into a cache outside the repository, and skips the build when it is
# already cached.
#
#   scripts/cargo-deny-build.sh [--cache DIR] [--print-dir]
#
# The version is pinned below, its dependencies by its own Cargo.lock (`cargo install --locked`).
# The cache is $IPKEEP_CARGO_DENY_CACHE or --cache (default /var/cache/ipkeep-cargo-deny); the
# build goes in a directory named by the cargo-deny and rustc versions, so changing one rebuilds
# and the old build stays until deleted: DIR/bin/cargo-deny. --print-dir prints DIR (last line).
# A cold build takes about 3 minutes on two cores, a warm one (cached) under a second.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
version=0.20.2
say() { echo "cargo-deny-build: $*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=scripts/lib/cached-build.sh
. "$repo/scripts/lib/cached-build.sh"

cached_build_args IPKEEP_CARGO_DENY_CACHE /var/cache/ipkeep-cargo-deny "$@"
# In the repository, so that rust-toolchain.toml picks the compiler.
cd "$repo"
rustc=$(rustc --version | cut -d' ' -f2)
cached_build_dir "$cache/cargo-deny$version-rustc$rustc"

if [ ! -x "$dir/bin/cargo-deny" ]; then
  say "building cargo-deny $version (log: $log)"
  # Its own target directory (not the workspace's), removed once the binary is in place.
  cargo install cargo-deny --version "$version" --locked --root "$dir" --target-dir "$dir/target" \
    >"$log" 2>&1 || { tail -20 "$log" >&2; die "building cargo-deny failed (full output in $log)"; }
  rm -rf "$dir/target"
fi
cached_build_ready "$dir/bin/cargo-deny ($("$dir/bin/cargo-deny" --version 2>/dev/null || echo "cargo-deny $version"), rustc $rustc)"

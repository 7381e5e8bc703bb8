#!/usr/bin/env bash
# Builds cargo-cyclonedx (the CycloneDX project's SBOM generator for Cargo, which
# scripts/release-bundle.sh runs for the bundle's SBOM) from crates.io into a cache outside the
# repository, and skips the build when it is already cached.
#
#   scripts/cargo-cyclonedx-build.sh [--cache DIR] [--print-dir]
#
# The version is pinned below, its dependencies by its own Cargo.lock (`cargo install --locked`).
# The cache is $IPKEEP_CARGO_CYCLONEDX_CACHE or --cache (default /var/cache/ipkeep-cargo-cyclonedx);
# the build goes in a directory named by the cargo-cyclonedx and rustc versions, so changing one
# rebuilds and the old build stays until deleted: DIR/bin/cargo-cyclonedx. --print-dir prints DIR
# (last line).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
version=0.5.9
say() { echo "cargo-cyclonedx-build: $*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=scripts/lib/cached-build.sh
. "$repo/scripts/lib/cached-build.sh"

cached_build_args IPKEEP_CARGO_CYCLONEDX_CACHE /var/cache/ipkeep-cargo-cyclonedx "$@"
# In the repository, so that rust-toolchain.toml picks the compiler.
cd "$repo"
rustc=$(rustc --version | cut -d' ' -f2)
cached_build_dir "$cache/cargo-cyclonedx$version-rustc$rustc"

if [ ! -x "$dir/bin/cargo-cyclonedx" ]; then
  say "building cargo-cyclonedx $version (log: $log)"
  # Its own target directory (not the workspace's), removed once the binary is in place.
  cargo install cargo-cyclonedx --version "$version" --locked --root "$dir" --target-dir "$dir/target" \
    >"$log" 2>&1 || { tail -20 "$log" >&2; die "building cargo-cyclonedx failed (full output in $log)"; }
  rm -rf "$dir/target"
fi
cached_build_ready "$dir/bin/cargo-cyclonedx (cargo-cyclonedx $version, rustc $rustc)"

#!/usr/bin/env bash
# The main job: builds ipkeep and runs the node-side demonstration in real network namespaces
# (Debian's bridge plugin delegating to ipkeep; a pod deleted and rebuilt keeps its IP).
# Needs root for network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "demo: needs root (it creates network namespaces); run it as root, e.g. sudo scripts/demo.sh" >&2
  exit 1
fi
scripts/install-deps.sh
cargo build --release --quiet -p ipkeep-cni -p ipkeep-tests --bins
IPKEEP_BIN="$PWD/target/release/ipkeep" exec target/release/netns-demo

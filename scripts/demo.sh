#!/usr/bin/env bash
# The main job: builds ipkeep and runs the whole system end to end on this machine
# (crates/e2e, docs/demo.md): an in-memory API server, simulators for a StatefulSet controller,
# a scheduler and a kubelet per node, and ipkeep's real controller, scheduler extension and node
# agents as processes. A 3-replica StatefulSet loses a pod, a node, then scales down and up;
# the timeline and a before/after table are printed, and the exit code says whether every
# expectation held.
#
# As root, pods get real network namespaces through Debian's bridge plugin; otherwise only the
# IPAM plugin runs (said plainly in the output). Arguments go to ipkeep-demo (see --help):
#   scripts/demo.sh --keep-running       # leave it up and poke at it with kubectl
#   scripts/demo.sh --restarts           # also restart every ipkeep component mid-scenario
#   scripts/demo.sh --kubeconfig FILE    # the same story on a real cluster with ipkeep installed
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -eq 0 ]; then
  scripts/install-deps.sh
else
  echo "demo: not root, so no network namespaces: the ipkeep IPAM plugin will run on its own" >&2
fi
cargo build --release --quiet --locked -p ipkeep-e2e -p ipkeep-cni -p ipkeep-agent -p ipkeep-controller \
  -p ipkeep-scheduler-ext --bins
exec target/release/ipkeep-demo "$@"

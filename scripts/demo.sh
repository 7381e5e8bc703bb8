#!/usr/bin/env bash
# The main job: ipkeep end to end on this machine (docs/demo.md). As root it starts a real
# Kubernetes cluster (scripts/cluster.sh: the control plane built from upstream's Go modules,
# two real nodes with containerd and kubelet, ipkeep installed from deploy/ as images), then a
# 3-replica StatefulSet: every ipkeep component and a node's kubelet and containerd restart, a
# pod is deleted (same node, same IP, reachable from the other node), a node stops (the pod
# falls back to another node with a new IP), the StatefulSet scales down and up, and every
# node's store is audited against the pods. It prints a timeline and a before/after table, and
# the exit code says whether every expectation held. The first run builds Kubernetes (about 10
# minutes) and ipkeep's release build; later runs take about two minutes.
#
# Without root the real cluster cannot run here: the same story then runs on the in-memory
# simulation (--simulated), and the output says so. Arguments go to ipkeep-demo (see --help):
#   scripts/demo.sh --keep-running       # leave the cluster up and poke at it with kubectl
#   scripts/demo.sh --simulated          # the simulation, even as root
#   scripts/demo.sh --kubeconfig FILE    # the story (API only) on another cluster with ipkeep
# The cluster runs Kubernetes v1.37.2; IPKEEP_K8S_VERSION=v1.35.4 (or v1.36.3) picks another
# supported release (scripts/cluster.sh --k8s-version).
set -euo pipefail
cd "$(dirname "$0")/.."

args=("$@")
if [ "$(id -u)" -eq 0 ]; then
  scripts/install-deps.sh
else
  case " $* " in
    *" --simulated "*|*" --kubeconfig "*) ;;
    *)
      echo "demo: NOT ROOT: a real cluster cannot run here (it needs network and mount namespaces, cgroups and containerd)." >&2
      echo "demo: running the SIMULATION instead (--simulated); run as root for the real cluster." >&2
      args+=(--simulated) ;;
  esac
fi
cargo build --release --quiet --locked -p ipkeep-e2e -p ipkeep-cni -p ipkeep-agent -p ipkeep-controller \
  -p ipkeep-scheduler-ext --bins
exec target/release/ipkeep-demo "${args[@]}"

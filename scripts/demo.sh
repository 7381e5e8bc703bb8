#!/usr/bin/env bash
# The main job: ipkeep end to end on this machine (docs/demo.md). As root it starts a real
# Kubernetes cluster (scripts/cluster.sh: the control plane built from upstream's Go modules,
# two real nodes with containerd and kubelet, ipkeep installed with Helm as images), then a
# 3-replica StatefulSet: every ipkeep component and a node's kubelet and containerd restart, a
# pod is deleted (same node, same IP, reachable from the other node), a node stops (the pod
# falls back to another node with a new IP), the StatefulSet scales down and up, and every
# node's store is audited against the pods. It prints a timeline and a before/after table, and
# the exit code says whether every expectation held. The first run builds what the run needs,
# showing its progress: the Kubernetes binaries the cluster runs (about 10 minutes) and one
# release build of ipkeep that scripts/cluster.sh reuses; later runs take about three and a half
# minutes.
#
# Without root, real nodes cannot run here (network and mount namespaces, cgroups, containerd):
# it then runs the control-plane half of the story (--control-plane-only) on the same control
# plane with kwok nodes (etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok
# need no root; ipkeep's controller and scheduler-ext run as local processes): the pins, the
# records, node loss and scaling. The node side is NOT shown (kwok nodes run no CNI plugin: a
# rebuilt pod keeping its IP, the node stores, the agents), and the output says so.
# Arguments go to ipkeep-demo (see --help):
#   scripts/demo.sh --keep-running          # leave the cluster up and poke at it with kubectl
#   scripts/demo.sh --control-plane-only    # the kwok story, even as root
#   scripts/demo.sh --kubeconfig FILE       # the story (API only) on another cluster with ipkeep
# The cluster runs Kubernetes v1.37.2; IPKEEP_K8S_VERSION=v1.35.4 (or v1.36.3) picks another
# supported release (scripts/cluster.sh --k8s-version).
set -euo pipefail
cd "$(dirname "$0")/.."

# ipkeep-demo, as the build below leaves it (cargo's target directory: CARGO_TARGET_DIR or the
# workspace's target/).
demo_bin() {
  echo "$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/ipkeep-demo"
}

case " $* " in
  *" --help "*|*" -h "*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    echo
    if [ -x "$(demo_bin)" ]; then
      "$(demo_bin)" --help
    else
      echo "ipkeep-demo's own flags: build it (cargo build --release -p ipkeep-e2e), then --help again."
    fi
    exit 0 ;;
esac

args=("$@")
# What the run needs: ipkeep-demo always; the controller and scheduler-ext for a cluster of
# kwok nodes (they run as local processes); with real nodes also the agent and the static plugin
# (in the nodes' image); against another cluster (--kubeconfig) nothing more.
mode=real
case " $* " in
  *" --kubeconfig "*) mode=kubeconfig ;;
  *" --control-plane-only "*) mode=kwok ;;
esac
if [ "$(id -u)" -ne 0 ] && [ "$mode" = real ]; then
  echo "demo: NOT ROOT: real nodes cannot run here (they need network and mount namespaces, cgroups and containerd)." >&2
  echo "demo: running the CONTROL-PLANE HALF of the story instead (--control-plane-only): the real control plane with kwok nodes;" >&2
  echo "demo: NOT SHOWN: the node side (a rebuilt pod keeping its IP, the node stores, the agents). Run as root for the whole story." >&2
  args+=(--control-plane-only)
  mode=kwok
fi
if [ "$(id -u)" -ne 0 ]; then
  # Three kwok nodes (zone-0..zone-2): a pod each, so losing one node strands one pod only.
  case " $* " in *" --nodes "*|*" --kubeconfig "*) ;; *) args+=(--nodes 3) ;; esac
fi
[ "$mode" = real ] && scripts/install-deps.sh
names=(ipkeep-e2e)
case $mode in
  real) names+=(ipkeep-agent ipkeep-controller ipkeep-scheduler-ext) ;;
  kwok) names+=(ipkeep-controller ipkeep-scheduler-ext) ;;
esac
# Each package's binary of its own name (ipkeep-e2e's is ipkeep-demo); not the controller's
# crdgen, a developer's tool.
packages=() bins=(--bin ipkeep-demo)
for p in "${names[@]}"; do
  packages+=(-p "$p")
  [ "$p" = ipkeep-e2e ] || bins+=(--bin "$p")
done

# One cargo build for everything the run needs: scripts/cluster.sh then uses these binaries
# (IPKEEP_RELEASE_DIR, IPKEEP_PLUGIN) instead of building its own set of packages, whose features
# would unify differently and compile most of the tree a second time.
# shellcheck source=scripts/lib/cargo-env.sh
. scripts/lib/cargo-env.sh
echo "demo: building ipkeep's release binaries (cargo build --release ${packages[*]}; the first time takes about 10 minutes on two cores)" >&2
cargo_build "demo: cargo build" --release --locked "${packages[@]}" "${bins[@]}"
IPKEEP_RELEASE_DIR=$(dirname "$(demo_bin)")
export IPKEEP_RELEASE_DIR
if [ "$mode" = real ]; then
  echo "demo: building the static ipkeep plugin for the nodes' image (scripts/build-plugin.sh)" >&2
  IPKEEP_PLUGIN=$(scripts/build-plugin.sh | tail -1)
  export IPKEEP_PLUGIN
fi
exec "$(demo_bin)" "${args[@]}"

#!/usr/bin/env bash
# The main job: ipkeep end to end on this machine (docs/demo.md). As root it starts a real
# Kubernetes cluster (scripts/cluster.sh: the control plane built from upstream's Go modules,
# two real nodes with containerd and kubelet, ipkeep installed with Helm as images), then a
# 3-replica StatefulSet: every ipkeep component and a node's kubelet and containerd restart, a
# pod is deleted (same node, same IP, reachable from the other node), a node stops (the pod
# falls back to another node with a new IP), the StatefulSet scales down and up, and every
# node's store is audited against the pods. It prints a timeline and a before/after table, and
# the exit code says whether every expectation held. The first run builds Kubernetes (about 10
# minutes) and ipkeep's release build; later runs take about three and a half minutes.
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
# The controller and scheduler-ext alone, as scripts/cluster.sh builds them (with other packages
# in the same build their features differ, and cluster.sh would build them again).
cluster_packages=(-p ipkeep-controller -p ipkeep-scheduler-ext)
packages=(-p ipkeep-e2e)
if [ "$(id -u)" -eq 0 ]; then
  scripts/install-deps.sh
  cluster_packages=(-p ipkeep-agent -p ipkeep-controller -p ipkeep-scheduler-ext)
  packages+=(-p ipkeep-cni)
else
  case " $* " in
    *" --control-plane-only "*|*" --kubeconfig "*) ;;
    *)
      echo "demo: NOT ROOT: real nodes cannot run here (they need network and mount namespaces, cgroups and containerd)." >&2
      echo "demo: running the CONTROL-PLANE HALF of the story instead (--control-plane-only): the real control plane with kwok nodes;" >&2
      echo "demo: NOT SHOWN: the node side (a rebuilt pod keeping its IP, the node stores, the agents). Run as root for the whole story." >&2
      args+=(--control-plane-only) ;;
  esac
  # Three kwok nodes (zone-0..zone-2): a pod each, so losing one node strands one pod only.
  case " $* " in *" --nodes "*|*" --kubeconfig "*) ;; *) args+=(--nodes 3) ;; esac
fi
echo "demo: building ipkeep's release binaries (cargo build --release; the first time takes several minutes)" >&2
cargo build --release --quiet --locked "${cluster_packages[@]}" --bins
cargo build --release --quiet --locked "${packages[@]}" --bins
exec "$(demo_bin)" "${args[@]}"

#!/usr/bin/env bash
# etcd and kube-apiserver for one test binary (tests/src/apiserver.rs runs it): the control plane
# of scripts/lib/controlplane.sh, as scripts/cluster.sh starts it, on loopback and without root,
# with deploy/crd.yaml applied.
#
#   tests/src/apiserver.sh DIR BIN ETCD-PORT PEER-PORT APISERVER-PORT
#
# DIR is its state (certificates, etcd's data, logs), BIN the directory of the Kubernetes
# binaries. It prints `ready` once kube-apiserver serves the CRD, then reads commands from its
# stdin: `gc` starts kube-controller-manager with the garbage collector and the namespace
# controller and prints `gc-ready` once it collects. When its stdin closes (the test binary
# exited or was killed) or a start fails, it kills every process it started and removes DIR.
set -euo pipefail

state=$1 bin=$2 p_etcd=$3 p_peer=$4 p_api=$5
repo=$(cd "$(dirname "$0")/../.." && pwd)
api_host=127.0.0.1 pin_cpus=
# The test binary reports the start itself; only errors are worth its output.
say() { :; }
die() { echo "apiserver: error: $*" >&2; exit 1; }
# Started once per test binary: poll often, and P-256 keys (RSA ones cost a second and a half).
wait_poll=0.1 pki_key=ec
# shellcheck source=scripts/lib/controlplane.sh
. "$repo/scripts/lib/controlplane.sh"

# SIGKILL: throwaway servers. A SIGTERM'd kube-apiserver whose etcd is gone takes minutes to
# shut down, and this shell (with every file descriptor the test binary's parent gave it) waited.
stop() {
  set +e
  local f
  for f in "$state"/pids/*; do
    [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$state"
}
trap stop EXIT

# gc: kube-controller-manager with the garbage collector and the namespace controller, ready when
# it collects (a dependent ConfigMap goes with its owner).
gc() {
  start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$state/admin.kubeconfig" \
    --controllers=garbagecollector,namespace --leader-elect=false --secure-port=0 --concurrent-gc-syncs=10
  local uid
  "${kubectl[@]}" -n default create configmap gc-owner >/dev/null
  uid=$("${kubectl[@]}" -n default get configmap gc-owner -o jsonpath='{.metadata.uid}')
  printf 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gc-dependent\n  namespace: default\n  ownerReferences: [{apiVersion: v1, kind: ConfigMap, name: gc-owner, uid: "%s"}]\n' "$uid" |
    "${kubectl[@]}" create -f - >/dev/null
  "${kubectl[@]}" -n default delete configmap gc-owner >/dev/null
  wait_for "the garbage collector" 60 kube-controller-manager gc_collected
}
gc_collected() { ! "${kubectl[@]}" -n default get configmap gc-dependent; }

mkdir -p "$state"/{logs,pids}
controlplane_pki "IP:127.0.0.1,DNS:localhost"
etcd_start --log-level=warn
apiserver_start --authorization-mode=RBAC --endpoint-reconciler-type=none \
  --service-cluster-ip-range=10.96.0.0/16 --enable-priority-and-fairness=false --cert-dir="$state/certs"
"${kubectl[@]}" apply -f "$repo/deploy/crd.yaml" >"$state/logs/crd.log" 2>&1 ||
  die "kubectl apply of the CRD failed: $(tail -5 "$state/logs/crd.log")"
crd_established
echo ready
while read -r cmd; do
  case $cmd in
    gc) gc; echo gc-ready ;;
  esac
done

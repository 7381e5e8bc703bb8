#!/usr/bin/env bash
# A toy service-discovery operator for ipkeep's lifecycle hooks (docs/lifecycle.md), for the
# example in lifecycle.yaml: it plays your registry. The registry is a file; each line is
#
#   <unix ms> register|deregister <pod> <pod uid> <pod IP> ready=<the pod's Ready condition>
#
#   deploy/examples/registry-operator.sh NAMESPACE SELECTOR REGISTRY_FILE [INTERVAL_SECONDS]
#
# Every INTERVAL_SECONDS (default 1) it lists the pods of SELECTOR and
# - registers each PreparingNormal pod that has an IP, then labels it
#   registry.example.com/registered=true (the pod becomes Normal, then Ready);
# - deregisters each PreparingDelete pod that still has that label once the pod is not Ready
#   (markPodNotReady took it out of its Services), then removes the label (ipkeep completes the
#   held deletion; a held eviction passes at its next retry).
# A real operator would watch instead of polling and call its registry's API. KUBECTL names the
# kubectl to use (default: kubectl on PATH, with its usual KUBECONFIG).
set -euo pipefail

[ $# -ge 3 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
ns=$1 selector=$2 registry=$3 interval=${4:-1}
kubectl=${KUBECTL:-kubectl}
registered=registry.example.com/registered
touch "$registry"

log() { echo "$(date +%s%3N) $*" >>"$registry"; }

while true; do
  # One line per pod: name|uid|state|IP|registered label|Ready.
  pods=$("$kubectl" -n "$ns" get pods -l "$selector" -o jsonpath='{range .items[*]}{.metadata.name}|{.metadata.uid}|{.metadata.labels.ipkeep\.dev/lifecycle-state}|{.status.podIP}|{.metadata.labels.registry\.example\.com/registered}|{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}') ||
    { sleep "$interval"; continue; }
  while IFS='|' read -r name uid state ip is_registered ready; do
    [ -n "$name" ] || continue
    case $state in
      PreparingNormal)
        [ -n "$ip" ] && [ "$is_registered" != true ] || continue
        log register "$name" "$uid" "$ip" "ready=${ready:-False}"
        "$kubectl" -n "$ns" label pod "$name" "$registered=true" --overwrite >/dev/null ||
          echo "registry-operator: could not label $name; retrying" >&2
        ;;
      PreparingDelete)
        [ "$is_registered" = true ] && [ "$ready" != True ] || continue
        log deregister "$name" "$uid" "$ip" "ready=$ready"
        "$kubectl" -n "$ns" label pod "$name" "$registered-" >/dev/null ||
          echo "registry-operator: could not label $name; retrying" >&2
        ;;
    esac
  done <<<"$pods"
  sleep "$interval"
done

# Installing ipkeep for scripts/cluster.sh (sourced after lib/controlplane.sh; uses nodes.sh's
# cni_version, dualstack.sh's cni_values_for_cluster and flannel.sh's flannel_enabled).
#
# - ipkeep_bundle: the release bundle real nodes install from (scripts/release-bundle.sh).
# - ipkeep_install: real nodes: as a user installs it (docs/install.md): from the release
#   bundle, its namespace.yaml, then `helm install` of its packaged chart (`--dry-run=server`
#   first) with the values an operator of this cluster would set (the scheduler extension's
#   Service at a fixed cluster IP so that kube-scheduler on the host can call it, the agent
#   writing each node's CNI configuration, the node layout's values from docs/distributions.md);
#   the image is the chart's default, imported into the nodes from the bundle; the controller
#   makes the webhook's certificates (the chart's default), and kube-scheduler starts with the
#   extender and the CA read from the Secret, as NOTES.txt tells the operator (unless
#   --without-extender).
# - ipkeep_up: kwok nodes only: the controller (two replicas) and scheduler-ext as local
#   processes, each with its own ServiceAccount's token; the webhooks with a url on loopback.
# shellcheck source=scripts/lib/require.sh
. "${BASH_SOURCE[0]%/*}/require.sh"
require_vars repo state say die start stop_one wait_for crd_established kubeconfig kubectl nodes extender admission client_auth ext_cluster_ip p_ext p_ext_probe p_ctl0 p_ctl1 scheduler_start node_layout

# shellcheck source=scripts/lib/cargo-env.sh
. "$repo/scripts/lib/cargo-env.sh"

# ipkeep_build PROFILE PACKAGE...: builds the packages' binaries; prints their directory. With
# IPKEEP_RELEASE_DIR set (scripts/demo.sh sets it) a release build uses the binaries already
# there instead: the demo builds them in the same cargo build as its own binary, and a second
# build with another set of packages would unify features differently and compile them again.
ipkeep_build() {
  local profile=$1 pkgs=() p; shift
  if [ "$profile" = release ] && [ -n "${IPKEEP_RELEASE_DIR:-}" ]; then
    for p in "$@"; do
      [ -x "$IPKEEP_RELEASE_DIR/$p" ] ||
        die "IPKEEP_RELEASE_DIR=$IPKEEP_RELEASE_DIR has no $p (cargo build --release -p $p, or unset IPKEEP_RELEASE_DIR)"
    done
    say "using the release build of $* in $IPKEEP_RELEASE_DIR (IPKEEP_RELEASE_DIR)"
    echo "$IPKEEP_RELEASE_DIR"
    return
  fi
  # Each package's binary of its own name (not the controller's crdgen, a developer's tool).
  for p in "$@"; do pkgs+=(-p "$p" --bin "$p"); done
  local release=(); [ "$profile" = release ] && release=(--release)
  say "building $* ($profile)"
  # Started from `cargo test`, the environment carries the test crate's variables
  # (scripts/lib/cargo-env.sh).
  (cd "$repo" && drop_test_cargo_env && cargo_build "cluster: cargo build" --locked "${release[@]}" "${pkgs[@]}") ||
    die "cargo build failed"
  echo "$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/$profile"
}

# ipkeep_plugin: builds the static plugin the image carries (scripts/build-plugin.sh); its path.
# IPKEEP_PLUGIN (set by scripts/demo.sh, which built it) names one built already.
ipkeep_plugin() {
  if [ -n "${IPKEEP_PLUGIN:-}" ]; then
    [ -x "$IPKEEP_PLUGIN" ] || die "IPKEEP_PLUGIN=$IPKEEP_PLUGIN is not an executable (scripts/build-plugin.sh builds it, or unset IPKEEP_PLUGIN)"
    say "using the static ipkeep plugin $IPKEEP_PLUGIN (IPKEEP_PLUGIN)"
    echo "$IPKEEP_PLUGIN"
    return
  fi
  say "building the static ipkeep plugin (scripts/build-plugin.sh)"
  "$repo/scripts/build-plugin.sh" | tail -1 || die "building the static plugin failed"
}

# ipkeep_bundle RELEASE-DIR PLUGIN: the directory of the release bundle ipkeep is installed
# from: the one IPKEEP_BUNDLE names (scripts/test.sh makes one for all the clusters of a run),
# checked against its SHA256SUMS and this tree's version; else scripts/release-bundle.sh of
# these binaries into DIR/bundle.
ipkeep_bundle() {
  local version
  version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
  if [ -n "${IPKEEP_BUNDLE:-}" ]; then
    (cd "$IPKEEP_BUNDLE" && sha256sum --quiet -c SHA256SUMS) >&2 ||
      die "IPKEEP_BUNDLE=$IPKEEP_BUNDLE: its files do not match its SHA256SUMS (make it again: scripts/release-bundle.sh)"
    [ -f "$IPKEEP_BUNDLE/ipkeep-$version.tgz" ] ||
      die "IPKEEP_BUNDLE=$IPKEEP_BUNDLE holds no ipkeep-$version.tgz: a bundle of another version"
    say "installing from the release bundle $IPKEEP_BUNDLE (IPKEEP_BUNDLE): $(head -2 "$IPKEEP_BUNDLE/RELEASE" | tr '\n' ' ')"
    echo "$IPKEEP_BUNDLE"
    return
  fi
  say "making the release bundle (scripts/release-bundle.sh) into $state/bundle"
  rm -rf "$state/bundle"
  "$repo/scripts/release-bundle.sh" "$state/bundle" --allow-dirty --release-dir "$1" --plugin "$2" >/dev/null ||
    die "scripts/release-bundle.sh failed"
  echo "$state/bundle"
}

# admission_resolve: the pinning path (--admission): auto becomes policy where kube-apiserver
# serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy, else webhook; written to
# DIR/admission for the tests and benchmarks to read.
admission_resolve() {
  if [ "$admission" = auto ]; then
    local served
    # Read whole first: `grep -q` would close the pipe early, and with pipefail kubectl's
    # SIGPIPE would read as "not served".
    served=$("${kubectl[@]}" api-resources --api-group=admissionregistration.k8s.io -o name) ||
      die "kubectl api-resources failed"
    if grep -q '^mutatingadmissionpolicies\.' <<<"$served"; then
      admission=policy
    else
      admission=webhook
    fi
  fi
  echo "$admission" >"$state/admission"
  say "new StatefulSet pods get their pin from the $( [ "$admission" = policy ] && echo "admission policy ipkeep-pin" || echo "mutating webhook") (--admission)"
}

# helm_cmd ARGS...: the cached Helm 4 (scripts/helm-build.sh; its path in $state/helm) on this
# cluster, with its own configuration and cache under $state/helm-home.
helm_cmd() {
  KUBECONFIG=$state/admin.kubeconfig HELM_CONFIG_HOME=$state/helm-home/config \
    HELM_CACHE_HOME=$state/helm-home/cache HELM_DATA_HOME=$state/helm-home/data "$(cat "$state/helm")" "$@"
}

ipkeep_install() {
  local values=$state/ipkeep-values.yaml log=$state/logs/helm.log
  local dir chart layout_values=()
  dir=$("$repo/scripts/helm-build.sh" --print-dir | tail -1) || die "scripts/helm-build.sh failed"
  echo "$dir/bin/helm" >"$state/helm"
  admission_resolve
  chart=$(ls "$bundle"/ipkeep-*.tgz)
  # The distribution's values (docs/distributions.md) first; this cluster's own after them.
  [ "$node_layout" = kubeadm ] || layout_values=(--values "$repo/charts/ipkeep/ci/$node_layout-values.yaml")
  say "installing ipkeep: helm install $chart (values: ${layout_values[*]:+${layout_values[1]}, }$values)"
  {
    echo "# Made by scripts/cluster.sh: what an operator of this cluster would set. The image is"
    echo "# the chart's default, imported into the nodes from the release bundle."
    echo "# kube-scheduler runs on the host, which cannot resolve *.svc: a fixed cluster IP for the"
    echo "# extender's urlPrefix (docs/install.md, step 4)."
    printf 'schedulerExt:\n  service:\n    clusterIP: %s\n' "$ext_cluster_ip"
    printf 'admission:\n  mode: %s\n' "$admission"
    # With flannel, flannel's configuration is the node's (scripts/lib/flannel.sh).
    flannel_enabled || cni_values_for_cluster "$cni_version"
  } >"$values"
  "${kubectl[@]}" apply -f "$bundle/namespace.yaml" >"$log" 2>&1 ||
    { tail -20 "$log" >&2; die "kubectl apply -f $bundle/namespace.yaml failed (log: $log)"; }
  local install=(install ipkeep "$chart" --namespace ipkeep-system "${layout_values[@]}" --values "$values")
  helm_cmd "${install[@]}" --dry-run=server >>"$log" 2>&1 ||
    { tail -20 "$log" >&2; die "helm install --dry-run=server failed (log: $log)"; }
  helm_cmd "${install[@]}" >>"$log" 2>&1 ||
    { tail -20 "$log" >&2; die "helm install failed (log: $log)"; }
  crd_established
  # The controller makes the CA and the serving certificate once its pods run; kube-scheduler
  # trusts that CA (NOTES.txt, step 1).
  wait_for "the webhook's CA (ipkeep-controller writes the Secret ipkeep-scheduler-ext-tls)" 240 "" webhook_ca_read
  if [ "$extender" = 1 ]; then
    say "restarting kube-scheduler with ipkeep's extender"
    stop_one kube-scheduler
    scheduler_start "https://$ext_cluster_ip:443" "$webhook_ca"
  fi
}

# webhook_ca_read: the CA in the Secret ipkeep-scheduler-ext-tls (base64) into $webhook_ca;
# fails while there is none.
webhook_ca_read() {
  webhook_ca=$("${kubectl[@]}" -n ipkeep-system get secret ipkeep-scheduler-ext-tls -o jsonpath='{.data.ca\.crt}') &&
    [ -n "$webhook_ca" ]
}

# spread DEPLOYMENT: two of its pods Ready, on two nodes.
spread() {
  local ready
  ready=$("${kubectl[@]}" -n ipkeep-system get pods -l "app.kubernetes.io/name=$1" \
    -o jsonpath='{range .items[*]}{.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status} {.metadata.deletionTimestamp}{"\n"}{end}' |
    awk '$2 == "True" && $3 == "" {print $1}' | sort -u | wc -l)
  [ "$ready" -ge 2 ]
}

# ipkeep_wait: every ipkeep workload rolled out, each Deployment's replicas on two nodes.
ipkeep_wait() {
  local w d pods
  for w in deployment/ipkeep-controller deployment/ipkeep-scheduler-ext daemonset/ipkeep-agent; do
    wait_for "ipkeep: $w" 180 "" "${kubectl[@]}" -n ipkeep-system rollout status "$w" --timeout=2s
  done
  [ "$nodes" -ge 2 ] || return 0
  # Their anti-affinity is preferred only (a one-node cluster runs both), and while the nodes
  # come up one may be Ready before the other and take both replicas. One node's loss must not
  # take out both: move one, as an operator would.
  for d in ipkeep-controller ipkeep-scheduler-ext; do
    spread "$d" && continue
    pods=$("${kubectl[@]}" -n ipkeep-system get pods -l "app.kubernetes.io/name=$d" \
      -o jsonpath='{range .items[*]}{.spec.nodeName} {.metadata.name}{"\n"}{end}' | sort)
    say "  $d: both replicas on $(head -1 <<<"$pods" | cut -d' ' -f1) (it was the first node Ready); moving one"
    "${kubectl[@]}" -n ipkeep-system delete pod "$(tail -1 <<<"$pods" | cut -d' ' -f2)" --wait=false >/dev/null
    wait_for "ipkeep: $d on two nodes" 120 "" spread "$d"
  done
}

# ipkeep_helm_test: `helm test` of the release, as NOTES.txt tells the operator.
ipkeep_helm_test() {
  say "helm test ipkeep"
  helm_cmd test ipkeep --namespace ipkeep-system --timeout 2m >>"$state/logs/helm.log" 2>&1 ||
    { tail -20 "$state/logs/helm.log" >&2; die "helm test ipkeep failed (log: $state/logs/helm.log)"; }
}

ipkeep_up() {
  local ib=$1 sa token ca
  say "installing ipkeep from deploy/"
  for f in namespace.yaml crd.yaml controller/rbac.yaml controller/admission-policies.yaml \
    scheduler-ext/rbac.yaml; do
    "${kubectl[@]}" apply -f "$repo/deploy/$f" >/dev/null
  done
  crd_established
  admission_resolve
  ca=$(base64 -w0 <"$state/pki/ca.crt")
  "${kubectl[@]}" patch --local -f "$repo/deploy/scheduler-ext/webhook.yaml" --type=json -o yaml -p "[
    {\"op\": \"replace\", \"path\": \"/webhooks/0/clientConfig\",
     \"value\": {\"url\": \"https://127.0.0.1:$p_ext/mutate-pods\", \"caBundle\": \"$ca\"}},
    {\"op\": \"replace\", \"path\": \"/webhooks/1/clientConfig\",
     \"value\": {\"url\": \"https://127.0.0.1:$p_ext/mutate-persistentpodstates\", \"caBundle\": \"$ca\"}}]" \
    >"$state/webhook.yaml"
  local i patch=
  for i in 0 1; do
    patch="$patch${patch:+,}{\"op\": \"replace\", \"path\": \"/webhooks/$i/clientConfig\",
     \"value\": {\"url\": \"https://127.0.0.1:$p_ext/validate-pods\", \"caBundle\": \"$ca\"}}"
  done
  "${kubectl[@]}" patch --local -f "$repo/deploy/scheduler-ext/lifecycle-webhook.yaml" --type=json -o yaml \
    -p "[$patch]" >"$state/lifecycle-webhook.yaml"
  for sa in ipkeep-controller ipkeep-scheduler-ext; do
    token=$("${kubectl[@]}" -n ipkeep-system create token "$sa" --duration=48h)
    kubeconfig "$state/$sa.kubeconfig" token "$token" ipkeep-system
  done
  say "starting ipkeep-scheduler-ext on https://127.0.0.1:$p_ext and two ipkeep-controller replicas"
  local client_ca=()
  [ "$client_auth" = 1 ] && client_ca=(--client-ca="$state/pki/ca.crt")
  start scheduler-ext env KUBECONFIG="$state/ipkeep-scheduler-ext.kubeconfig" \
    "$ib/ipkeep-scheduler-ext" --listen="127.0.0.1:$p_ext" --probe-listen="127.0.0.1:$p_ext_probe" \
    --tls-cert="$state/pki/scheduler-ext.crt" --tls-key="$state/pki/scheduler-ext.key" "${client_ca[@]}"
  start controller-0 env KUBECONFIG="$state/ipkeep-controller.kubeconfig" POD_NAME=controller-0 \
    "$ib/ipkeep-controller" --probe-listen="127.0.0.1:$p_ctl0" --lease-duration=6s
  start controller-1 env KUBECONFIG="$state/ipkeep-controller.kubeconfig" POD_NAME=controller-1 \
    "$ib/ipkeep-controller" --probe-listen="127.0.0.1:$p_ctl1" --lease-duration=6s
  wait_for ipkeep-scheduler-ext 60 scheduler-ext curl -fsS "http://127.0.0.1:$p_ext_probe/readyz"
  wait_for "ipkeep-controller replica 0" 60 controller-0 curl -fsS "http://127.0.0.1:$p_ctl0/readyz"
  wait_for "ipkeep-controller replica 1" 60 controller-1 curl -fsS "http://127.0.0.1:$p_ctl1/readyz"
  local pin=$state/webhook.yaml
  [ "$admission" = policy ] && pin=$repo/deploy/admission-policy/pin-policy.yaml
  "${kubectl[@]}" apply -f "$pin" -f "$state/lifecycle-webhook.yaml" >/dev/null
  cat >"$state/ipkeep.env" <<EOF
IPKEEP_EXT_URL=https://127.0.0.1:$p_ext
IPKEEP_EXT_PROBE=http://127.0.0.1:$p_ext_probe
IPKEEP_CONTROLLER_PROBES=http://127.0.0.1:$p_ctl0,http://127.0.0.1:$p_ctl1
IPKEEP_EXT_CLIENT_AUTH=$client_auth
EOF
}


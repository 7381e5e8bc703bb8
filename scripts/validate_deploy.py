"""Offline validation of what a cluster admin applies (deploy/, or the directory given).

Run by scripts/validate-deploy.sh, which makes the virtualenv with the pinned tools and says
what is checked; importable (the checks are functions, `main` runs them):

    K8S_VERSIONS="1.33 1.35 1.37" KUBECTL=/path/to/kubectl HELM=/path/to/helm \
        CHART=charts/ipkeep PROMTOOL=/path/to/promtool python3 scripts/validate_deploy.py deploy
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

import jsonschema
import promql_parser
import yaml
from kubernetes_validate import utils as kv

# Set by main(): the directory checked, the Kubernetes versions, the kubectl of the cluster build
# ("" skips the renderings), the helm of scripts/helm-build.sh and the chart ("" skips the
# comparisons with the chart), the promtool of scripts/promtool-build.sh ("" skips `promtool
# check rules` and `promtool test rules`), and what was found.
root = "deploy"
versions = []
kubectl = ""
helm = ""
chart = ""
promtool = ""
# promtool's unit tests of a few alerts; they name the rule file ipkeep-rules.yaml.
RULE_TESTS = "tests/monitoring/alerts-test.yaml"
failures, passed, skipped = [], [], []
documents = []  # (where, path, doc)
crd_schemas = {}  # (group/version, kind) -> schema


def fail(where, why):
    failures.append(f"{where}: {why}")
    print(f"FAIL {where}: {why}")


def skip(where, why):
    skipped.append(where)
    print(f"SKIP {where}: {why}")


def ok(where, how):
    passed.append(where)
    print(f"ok   {where} ({how})")


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError(f"duplicate key(s) {dup}")
    return dict(pairs)


def walk(exts):
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(exts):
                yield os.path.join(d, f)


def rel(path):
    return os.path.relpath(path, root)


# 1. Parse everything.
def parse_documents():
    for path in walk((".yaml", ".yml")):
        try:
            with open(path) as f:
                docs = list(yaml.load_all(f, Loader=StrictLoader))
        except Exception as e:  # noqa: BLE001 - any parse error is a failure to report
            fail(rel(path), f"not valid YAML: {e}")
            continue
        docs = [d for d in docs if d is not None]
        if not docs:
            fail(rel(path), "no YAML document")
        for i, doc in enumerate(docs):
            where = f"{rel(path)}#{i}"
            if not isinstance(doc, dict):
                fail(where, f"a document must be an object, found {type(doc).__name__}")
            elif not isinstance(doc.get("apiVersion"), str) or not isinstance(doc.get("kind"), str):
                fail(where, "a document needs string apiVersion and kind")
            else:
                name = (doc.get("metadata") or {}).get("name", "")
                documents.append((f"{where} {doc['kind']}/{name}".rstrip("/"), path, doc))


def check_conflist(path):
    with open(path) as f:
        check_conflist_text(rel(path), f.read())


def check_conflist_text(where, text):
    try:
        conf = json.loads(text, object_pairs_hook=no_duplicates)
    except Exception as e:  # noqa: BLE001
        return fail(where, f"not valid JSON: {e}")
    problems = []
    if not isinstance(conf, dict):
        return fail(where, "a conflist must be a JSON object")
    for key in ("cniVersion", "name"):
        if not isinstance(conf.get(key), str) or not conf.get(key):
            problems.append(f"{key} must be a non-empty string")
    plugins = conf.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        problems.append("plugins must be a non-empty list")
        plugins = []
    ipkeep_users = 0
    for n, plugin in enumerate(plugins):
        if not isinstance(plugin, dict) or not isinstance(plugin.get("type"), str):
            problems.append(f"plugins[{n}] needs a string type")
            continue
        ipam = plugin.get("ipam") or {}
        if ipam.get("type") != "ipkeep":
            continue
        ipkeep_users += 1
        caps = plugin.get("capabilities") or {}
        if caps.get("io.kubernetes.cri.pod-annotations") is not True:
            problems.append(f"plugins[{n}] ({plugin['type']}) delegates to ipkeep but lacks the "
                            "capability io.kubernetes.cri.pod-annotations: true (retention "
                            "reads the pod's annotations)")
        if plugin["type"] == "flannel":
            # flannel refuses delegate.ipam, and replaces ipam.ranges with its subnet.env.
            delegate = plugin.get("delegate") or {}
            for key in ("ipam", "name"):
                if key in delegate:
                    problems.append(f"plugins[{n}].delegate.{key}: flannel refuses it "
                                    f"(it sets it itself); put IPAM in plugins[{n}].ipam")
            for key in ("ranges", "subnet", "rangeStart", "rangeEnd"):
                if key in ipam:
                    problems.append(f"plugins[{n}].ipam.{key}: flannel fills the ranges from "
                                    "/run/flannel/subnet.env; a subnet here becomes an extra "
                                    "range set")
    if ipkeep_users == 0:
        problems.append("no plugin uses ipam type ipkeep")
    if problems:
        for p in problems:
            fail(where, p)
    else:
        ok(where, "JSON, CNI shape, ipkeep capability")


def check_conflists():
    for path in walk((".conflist", ".conf", ".json")):
        check_conflist(path)


# 2./3. Validate each object.
def strictify(schema):
    """OpenAPI structural schema → JSON Schema that refuses unknown fields, like the API
    server's strict field validation (kubectl's default)."""
    if isinstance(schema, dict):
        out = {k: strictify(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strictify(v) for v in schema]
    return schema


def collect_crd_schemas():
    for _, _, doc in documents:
        if doc["kind"] == "CustomResourceDefinition" and doc["apiVersion"].startswith("apiextensions.k8s.io/"):
            spec = doc.get("spec") or {}
            for v in spec.get("versions") or []:
                schema = ((v.get("schema") or {}).get("openAPIV3Schema"))
                if schema and v.get("served", True):
                    crd_schemas[(f"{spec.get('group')}/{v.get('name')}",
                                 (spec.get("names") or {}).get("kind"))] = strictify(schema)

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
METADATA_KEYS = {"name", "generateName", "namespace", "labels", "annotations"}


def check_custom_resource(where, doc, schema):
    meta = doc.get("metadata") or {}
    errors = []
    unknown = sorted(set(meta) - METADATA_KEYS)
    if unknown:
        errors.append(f"metadata: unexpected {unknown}")
    if not DNS_SUBDOMAIN.match(str(meta.get("name", ""))) or len(str(meta.get("name"))) > 253:
        errors.append(f"metadata.name {meta.get('name')!r} is not a DNS subdomain")
    for key in ("labels", "annotations"):
        value = meta.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            errors.append(f"metadata.{key} must map strings to strings")
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    validator = jsonschema.Draft7Validator(schema)
    for e in sorted(validator.iter_errors(body), key=lambda e: list(e.path)):
        errors.append(f"{'.'.join(map(str, e.path)) or '(root)'}: {e.message}")
    if errors:
        for e in errors:
            fail(where, e)
    else:
        ok(where, f"against the CRD schema of {doc['apiVersion']} {doc['kind']}, strict")


# kube-scheduler's KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) fields.
SCHEDULER_TOP = {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
                 "healthzBindAddress", "metricsBindAddress", "enableProfiling",
                 "enableContentionProfiling", "percentageOfNodesToScore",
                 "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
                 "delayCacheUntilActive"}
EXTENDER_KEYS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight",
                 "bindVerb", "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable",
                 "managedResources", "ignorable"}
TLS_KEYS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData",
            "caData"}


def check_scheduler_config(where, doc):
    errors = [f"unknown field {k}" for k in sorted(set(doc) - SCHEDULER_TOP)]
    for n, ext in enumerate(doc.get("extenders") or []):
        errors += [f"extenders[{n}]: unknown field {k}" for k in sorted(set(ext) - EXTENDER_KEYS)]
        errors += [f"extenders[{n}].tlsConfig: unknown field {k}"
                   for k in sorted(set(ext.get("tlsConfig") or {}) - TLS_KEYS)]
        if not str(ext.get("urlPrefix", "")).startswith(("http://", "https://")):
            errors.append(f"extenders[{n}].urlPrefix must be an http(s) URL")
        if ext.get("enableHTTPS") and not str(ext.get("urlPrefix", "")).startswith("https://"):
            errors.append(f"extenders[{n}]: enableHTTPS with a non-https urlPrefix")
        w = ext.get("weight", 1)
        if ext.get("prioritizeVerb") and (not isinstance(w, int) or w <= 0):
            errors.append(f"extenders[{n}].weight must be a positive integer with prioritizeVerb")
    if errors:
        for e in errors:
            fail(where, e)
    else:
        skip(where, "kube-scheduler reads it from a file; it is not an API object and "
                    "kubernetes-validate has no schema for it. Checked: known v1 fields only "
                    "(extender values are cross-checked by tests/tests/deploy.rs)")


def check_kustomization(where, path, doc):
    base = os.path.dirname(path)
    missing = [r for r in doc.get("resources") or []
               if not os.path.exists(os.path.join(base, r))]
    for r in missing:
        fail(where, f"resources: {r} does not exist")
    if missing:
        return
    if not kubectl:
        return skip(where, "resources exist; `kubectl kustomize` not run (no kubectl from the cluster build)")
    out = subprocess.run([kubectl, "kustomize", base], capture_output=True, text=True)
    if out.returncode != 0:
        return fail(where, f"kubectl kustomize failed: {out.stderr.strip()}")
    kinds = len([d for d in yaml.safe_load_all(out.stdout) if d])
    ok(where, f"resources exist; kubectl kustomize renders {kinds} objects")


def check_component(where, path, doc):
    """A kustomize Component (deploy/cni): its files exist, and deploy/ with it renders into
    objects that are valid in every version (checked like the files themselves)."""
    base = os.path.dirname(path)
    files = [f.split("=", 1)[-1] for g in doc.get("configMapGenerator") or []
             for f in g.get("files") or []]
    missing = [f for f in files if not os.path.exists(os.path.join(base, f))]
    for f in missing:
        fail(where, f"configMapGenerator: {f} does not exist")
    if missing:
        return
    if not kubectl:
        return skip(where, "files exist; `kubectl kustomize` not run (no kubectl from the cluster build)")
    with tempfile.TemporaryDirectory() as t:
        with open(os.path.join(t, "kustomization.yaml"), "w") as f:
            yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1",
                            "kind": "Kustomization",
                            "resources": [os.path.relpath(root, t)],
                            "components": [os.path.relpath(base, t)]}, f)
        out = subprocess.run([kubectl, "kustomize", t], capture_output=True, text=True)
    if out.returncode != 0:
        return fail(where, f"{os.path.relpath(root)} with this component does not render: {out.stderr.strip()}")
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    bad = 0
    for d in rendered:
        name = f"{where} -> {d.get('kind')}/{(d.get('metadata') or {}).get('name', '')}"
        if (d["apiVersion"], d["kind"]) in crd_schemas or d["kind"] == "CustomResourceDefinition":
            continue
        if d["apiVersion"].startswith("cert-manager.io/"):
            continue  # checked as files (check_cert_manager)
        if d["apiVersion"].startswith("monitoring.coreos.com/") and d["kind"] == "PodMonitor":
            bad += not check_pod_monitor(name, d, quiet=True)
            continue
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            bad += not check_prometheus_rule(name, d, quiet=True)
            continue
        bad += not check_object(name, d, quiet=True)
    if not bad:
        ok(where, f"deploy/ with this component renders {len(rendered)} objects, each valid "
                  f"(kubernetes-validate --strict, Kubernetes {', '.join(versions)})")
    if any(g.get("name") == "ipkeep-cni-config" for g in doc.get("configMapGenerator") or []):
        same_as_chart(where, rendered)
    if any(r.endswith("certificate.yaml") for r in doc.get("resources") or []):
        same_objects_as_chart(where, rendered, ["certManager.enabled=true"])
    if any(r.endswith("pin-policy.yaml") for r in doc.get("resources") or []):
        same_objects_as_chart(where, rendered, ["admission.mode=policy"])


def same_objects_as_chart(where, rendered, sets):
    """deploy/ with a component whose patches turn the base into what the chart renders with
    `sets` (deploy/cert-manager): every object the same, none more, none less."""
    if not helm:
        return skip(f"{where} (same as the chart)", "no helm (IPKEEP_HELM)")
    cmd = [helm, "template", "ipkeep", chart, "--namespace", "ipkeep-system", "--skip-tests",
           "--set", "namespace.create=true", "--set", "namespace.name=ipkeep-system"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return fail(where, f"helm template failed: {out.stderr.strip()}")

    # Helm hooks (the policy mode's removal of an older webhook configuration) are no objects
    # of the install: kustomize has none.
    def by_identity(docs):
        return {(d["kind"], d["metadata"]["name"]): d for d in docs
                if d and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})}
    want, got = by_identity(yaml.safe_load_all(out.stdout)), by_identity(rendered)
    differ = sorted(f"{k}/{n}" for k, n in set(want) | set(got)
                    if want.get((k, n)) != got.get((k, n)))
    if differ:
        return fail(where, f"deploy/ with this component differs from the chart with "
                           f"{' '.join(sets)} in: {', '.join(differ)} (scripts/render-deploy.sh "
                           "writes its patches; is deploy/ stale?)")
    ok(f"{where} (same as the chart)", f"{len(got)} objects, each the chart's with {' '.join(sets)}")


def same_as_chart(where, rendered):
    """The kustomize component patches the agent DaemonSet by hand; the chart's cni.enabled
    does the same in its template. Both must give the same DaemonSet (the ConfigMap's name
    aside: kustomize appends a hash of its content)."""
    if not helm:
        return skip(f"{where} (same as the chart)", "no helm (IPKEEP_HELM)")
    out = subprocess.run([helm, "template", "ipkeep", chart, "--namespace", "ipkeep-system",
                          "--set", "cni.enabled=true", "--show-only",
                          "templates/agent/daemonset.yaml"], capture_output=True, text=True)
    if out.returncode != 0:
        return fail(where, f"helm template failed: {out.stderr.strip()}")
    want = next(d for d in yaml.safe_load_all(out.stdout) if d)
    got = next((d for d in rendered if d.get("kind") == "DaemonSet"), None)
    if got is None:
        return fail(where, "no DaemonSet in the rendering with this component")
    for v in (got["spec"]["template"]["spec"].get("volumes") or []):
        if (v.get("configMap") or {}).get("name", "").startswith("ipkeep-cni-config-"):
            v["configMap"]["name"] = "ipkeep-cni-config"
    if got != want:
        return fail(where, "the agent DaemonSet with this component differs from the chart's "
                           "with cni.enabled=true (charts/ipkeep/templates/agent/daemonset.yaml): "
                           "make the component's patches do what the template does")
    ok(f"{where} (same as the chart)", "its agent DaemonSet is the chart's with cni.enabled=true")


# Kinds served only from a Kubernetes release on: checked in the versions from that one.
SINCE = {("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): (1, 30),
         ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): (1, 30),
         ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy"): (1, 36),
         ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding"): (1, 36)}


def check_object(where, doc, quiet=False):
    """kubernetes-validate --strict in every version (that serves its kind); whether it passed."""
    checked = []
    since = SINCE.get((doc["apiVersion"], doc["kind"]), (0, 0))
    for version in versions:
        if tuple(int(p) for p in version.split(".")[:2]) < since:
            continue
        try:
            checked.append(kv.validate(doc, version, strict=True))
        except kv.ValidationError as e:
            path_ = ".".join(str(p) for p in e.path) or "(root)"
            fail(where, f"Kubernetes {e.version}: {path_}: {e.message}")
            return False
        except kv.SchemaNotFoundError:
            fail(where, f"no schema for {doc['apiVersion']} {doc['kind']} in Kubernetes {version}, "
                        "and it is not a kind this script knows how to check (a typo, or a removed API?)")
            return False
    if not quiet:
        ok(where, "kubernetes-validate --strict, Kubernetes " + ", ".join(checked))
    return True


def check_cert_manager(where, doc):
    spec = doc.get("spec") or {}
    errors = []
    if doc["kind"] == "Certificate":
        if not spec.get("secretName"):
            errors.append("spec.secretName is required")
        if not (spec.get("issuerRef") or {}).get("name"):
            errors.append("spec.issuerRef.name is required")
    elif doc["kind"] in ("Issuer", "ClusterIssuer"):
        kinds = [k for k in ("selfSigned", "ca", "acme", "vault", "venafi") if k in spec]
        if len(kinds) != 1:
            errors.append(f"spec needs exactly one issuer type, found {kinds}")
    if errors:
        for e in errors:
            fail(where, e)
    else:
        skip(where, "cert-manager's CRD schemas cannot be fetched offline; checked only "
                    "secretName/issuerRef (Certificate) or one issuer type (Issuer)")


DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}


def check_prometheus_rule(where, doc, quiet=False):
    """A PrometheusRule: the fields the Prometheus Operator's CRD has for groups and rules,
    nothing else, and every expr valid PromQL. Whether it passed."""
    errors = []
    if doc["apiVersion"] != "monitoring.coreos.com/v1" or doc["kind"] != "PrometheusRule":
        errors.append(f"only monitoring.coreos.com/v1 PrometheusRule is known, not {doc['apiVersion']} {doc['kind']}")
    spec = doc.get("spec") or {}
    errors += [f"spec: unknown field {k}" for k in sorted(set(spec) - {"groups"})]
    names = set()
    for g, group in enumerate(spec.get("groups") or []):
        at = f"spec.groups[{g}]"
        errors += [f"{at}: unknown field {k}" for k in sorted(set(group) - {"name", "interval", "rules", "limit", "partial_response_strategy", "query_offset", "labels"})]
        if not isinstance(group.get("name"), str) or group["name"] in names:
            errors.append(f"{at}.name must be a unique string")
        names.add(group.get("name"))
        for r, rule in enumerate(group.get("rules") or []):
            at_rule = f"{at}.rules[{r}] ({rule.get('alert') or rule.get('record')})"
            errors += [f"{at_rule}: unknown field {k}" for k in sorted(set(rule) - RULE_KEYS)]
            if ("alert" in rule) == ("record" in rule):
                errors.append(f"{at_rule}: exactly one of alert and record")
            if "for" in rule and not DURATION.match(str(rule["for"])):
                errors.append(f"{at_rule}.for: {rule['for']!r} is not a duration")
            for key in ("labels", "annotations"):
                value = rule.get(key, {})
                if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                    errors.append(f"{at_rule}.{key} must map strings to strings")
            try:
                promql_parser.parse(str(rule.get("expr", "")))
            except Exception as e:  # noqa: BLE001 - the parser's error is the message
                errors.append(f"{at_rule}.expr is not PromQL: {e}")
    if not spec.get("groups"):
        errors.append("spec.groups is empty")
    for e in errors:
        fail(where, e)
    if not errors and not quiet:
        ok(where, f"PrometheusRule fields by hand, every expr parsed as PromQL (promql-parser {getattr(promql_parser, '__version__', '0.11.0')})")
        check_rules_with_promtool(where, spec["groups"])
    return not errors


ENDPOINT_KEYS = {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings",
                 "metricRelabelings", "honorLabels"}


def check_pod_monitor(where, doc, quiet=False):
    """A PodMonitor: the fields of the Prometheus Operator's CRD the chart uses, nothing else
    (its schema cannot be fetched offline)."""
    errors = []
    if doc["apiVersion"] != "monitoring.coreos.com/v1":
        errors.append(f"only monitoring.coreos.com/v1 PodMonitor is known, not {doc['apiVersion']}")
    spec = doc.get("spec") or {}
    errors += [f"spec: unknown field {k}" for k in sorted(set(spec) - {"selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel"})]
    if not (spec.get("selector") or {}).get("matchLabels"):
        errors.append("spec.selector.matchLabels is required")
    endpoints = spec.get("podMetricsEndpoints") or []
    if not endpoints:
        errors.append("spec.podMetricsEndpoints is empty")
    for n, e in enumerate(endpoints):
        errors += [f"spec.podMetricsEndpoints[{n}]: unknown field {k}" for k in sorted(set(e) - ENDPOINT_KEYS)]
        if "interval" in e and not DURATION.match(str(e["interval"])):
            errors.append(f"spec.podMetricsEndpoints[{n}].interval: {e['interval']!r} is not a duration")
    for e in errors:
        fail(where, e)
    if not errors and not quiet:
        skip(where, "the Prometheus Operator's CRD schemas cannot be fetched offline; checked "
                    "its fields by hand")
    return not errors


def check_rules_with_promtool(where, groups):
    """Prometheus's own checks of the rule groups (`promtool check rules`: syntax, durations,
    templates, duplicates) and its unit tests of a few alerts (`promtool test rules`)."""
    where = f"{where} (promtool)"
    if not promtool:
        return skip(where, "no promtool (IPKEEP_PROMTOOL; scripts/promtool-build.sh builds one)")
    with tempfile.TemporaryDirectory() as t:
        with open(os.path.join(t, "ipkeep-rules.yaml"), "w") as f:
            yaml.safe_dump({"groups": groups}, f, sort_keys=False)
        with open(RULE_TESTS) as src, open(os.path.join(t, "alerts-test.yaml"), "w") as dst:
            dst.write(src.read())
        for args in (["check", "rules", "ipkeep-rules.yaml"], ["test", "rules", "alerts-test.yaml"]):
            out = subprocess.run([promtool, *args], cwd=t, capture_output=True, text=True)
            if out.returncode != 0:
                return fail(where, f"promtool {' '.join(args)}: {(out.stdout + out.stderr).strip()}")
    ok(where, f"promtool check rules, and test rules with {RULE_TESTS}")


def check_dashboard(where, text):
    """A Grafana dashboard (a ConfigMap's *.json): JSON without duplicate keys, panels with
    targets, and every target's expr PromQL once Grafana's interval variables are filled in.
    Whether its metrics exist is tests/tests/monitoring.rs (it scrapes the binaries)."""
    try:
        dashboard = json.loads(text, object_pairs_hook=no_duplicates)
    except Exception as e:  # noqa: BLE001
        return fail(where, f"not JSON: {e}")
    errors, exprs = [], 0
    for panel in dashboard.get("panels") or []:
        if panel.get("type") == "row":
            continue
        if not panel.get("targets"):
            errors.append(f"panel {panel.get('title')!r} has no targets")
        for target in panel.get("targets") or []:
            expr = re.sub(r"\$__(rate_)?interval", "5m", str(target.get("expr", "")))
            exprs += 1
            try:
                promql_parser.parse(expr)
            except Exception as e:  # noqa: BLE001 - the parser's error is the message
                errors.append(f"panel {panel.get('title')!r}: {target.get('expr')!r} is not PromQL: {e}")
    if not exprs:
        errors.append("no panel queries anything")
    for e in errors:
        fail(where, e)
    if not errors:
        ok(where, f"Grafana dashboard JSON, {exprs} panel queries parsed as PromQL")


def check_documents():
    # A Component's patch files are not objects: checked with the component (kubectl kustomize).
    patches = {os.path.normpath(os.path.join(os.path.dirname(path), p["path"])): where
               for where, path, doc in documents
               if doc["apiVersion"].startswith("kustomize.config.k8s.io/") and doc["kind"] == "Component"
               for p in doc.get("patches") or [] if "path" in p}
    for where, path, doc in documents:
        gv, kind = doc["apiVersion"], doc["kind"]
        if os.path.normpath(path) in patches:
            skip(where, f"a patch of {patches[os.path.normpath(path)]}: checked with it")
            continue
        if gv.startswith("kustomize.config.k8s.io/") and kind == "Kustomization":
            check_kustomization(where, path, doc)
            continue
        if gv.startswith("kustomize.config.k8s.io/") and kind == "Component":
            check_component(where, path, doc)
            continue
        if gv.startswith("kubescheduler.config.k8s.io/") and kind == "KubeSchedulerConfiguration":
            check_scheduler_config(where, doc)
            continue
        if gv.startswith("cert-manager.io/"):
            check_cert_manager(where, doc)
            continue
        if gv.startswith("monitoring.coreos.com/") and kind == "PodMonitor":
            check_pod_monitor(where, doc)
            continue
        if gv.startswith("monitoring.coreos.com/"):
            check_prometheus_rule(where, doc)
            continue
        if (gv, kind) in crd_schemas:
            check_custom_resource(where, doc, crd_schemas[(gv, kind)])
            continue
        check_object(where, doc)
        if gv == "v1" and kind == "ConfigMap":
            # The chart's CNI template (cni.enabled): the node file the agent writes.
            for key, text in sorted((doc.get("data") or {}).items()):
                if key.endswith(".conflist"):
                    check_conflist_text(f"{where} data.{key}", text)
                elif key.endswith(".json"):
                    check_dashboard(f"{where} data.{key}", text)


def check_versions():
    """The chart's version and appVersion are the workspace's version (the image tag follows
    appVersion): one version for the project (CHANGELOG.md)."""
    with open("Cargo.toml") as f:
        m = re.search(r'^\[workspace\.package\][^\[]*?^version = "([^"]+)"', f.read(), re.M | re.S)
    with open(os.path.join(chart, "Chart.yaml")) as f:
        meta = yaml.safe_load(f)
    where = os.path.join(chart, "Chart.yaml")
    want = m.group(1) if m else None
    got = (str(meta.get("version")), str(meta.get("appVersion")))
    if got != (want, want):
        return fail(where, f"version {got[0]} and appVersion {got[1]} must both be the workspace's "
                           f"version {want} (Cargo.toml [workspace.package])")
    ok(where, f"version and appVersion are the workspace's {want}")


def main(argv):
    global root, versions, kubectl, helm, chart, promtool
    started = time.monotonic()
    root = argv[1]
    versions = os.environ["K8S_VERSIONS"].split()
    kubectl = os.environ.get("KUBECTL", "")
    helm = os.environ.get("HELM", "")
    chart = os.environ.get("CHART", "charts/ipkeep")
    promtool = os.environ.get("PROMTOOL", "")
    parse_documents()
    check_conflists()
    collect_crd_schemas()
    check_documents()
    check_versions()
    elapsed = time.monotonic() - started
    print(f"validate-deploy: {len(passed)} valid, {len(failures)} invalid, {len(skipped)} skipped "
          f"(kubernetes-validate {kv.__version__}, Kubernetes {', '.join(versions)}; {elapsed:.1f}s)")
    if failures:
        print("validate-deploy: FAILED:", *failures, sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv)

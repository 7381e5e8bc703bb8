#!/usr/bin/env python3
"""The checks and figures of scripts/upgrade-test.sh, from what it saved (no cluster access).

  upgrade_check.py audit --pods PODS.json --pps PPS.json [--store NODE=LIST.json ...]
  upgrade_check.py records --pps PPS.json
  upgrade_check.py carried --before RECORDS --after RECORDS
  upgrade_check.py rebuilds --tsv REBUILDS.tsv
  upgrade_check.py plugin --log NODE=WATCH.log ...
  upgrade_check.py conflist --in IPKEEP.conflist
  upgrade_check.py crd --got CRD.json --want CRD.json

audit prints one line per expectation, `ok <text>` or `FAIL <text>`: no address has two owners
(every pod on the pod network, all namespaces); each node's store (`ipkeep list --json`) holds
exactly the addresses of the pods running there and nothing held; each PersistentPodState
record matches its pod (node and IP). records prints `pod node ip` per record; carried compares
two such lists (every record of a pod still there says the same node and IP). rebuilds and
plugin print the figures of the load and of the node-side watch of /opt/cni/bin/ipkeep.
conflist prints the host-local configuration that replaces ipkeep's (docs/install.md,
"Uninstall"): the same main plugin and ranges, IPAM host-local. crd says whether the CRD the API
server serves (kubectl get -o json) has the versions and schemas of another (the chart's, as
`kubectl create --dry-run=client -o json` reads it). Only the standard library is used.
"""

import argparse
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def pod_ips(pod):
    st = pod.get("status", {})
    ips = [p["ip"] for p in st.get("podIPs") or [] if p.get("ip")]
    if not ips and st.get("podIP"):
        ips = [st["podIP"]]
    return ips


def audit(args):
    pods = load(args.pods)["items"]
    lines = []
    owners, by_node = {}, {}
    for p in pods:
        if p["spec"].get("hostNetwork") or p["metadata"].get("deletionTimestamp"):
            continue
        if p.get("status", {}).get("phase") not in ("Running", "Pending"):
            continue
        who = f'{p["metadata"]["namespace"]}/{p["metadata"]["name"]}'
        node = p["spec"].get("nodeName")
        for ip in pod_ips(p):
            owners.setdefault(ip, []).append(who)
            if node:
                by_node.setdefault(node, set()).add(ip)
    shared = {ip: w for ip, w in owners.items() if len(w) > 1}
    lines.append((not shared, f"no address has two owners ({len(owners)} addresses)"
                  + "".join(f"; {ip}: {', '.join(w)}" for ip, w in sorted(shared.items()))))
    for spec in args.store or []:
        node, path = spec.split("=", 1)
        try:
            leases = load(path).get("leases", [])
        except (OSError, ValueError) as e:
            lines.append((False, f"{node}: no store listing ({e})"))
            continue
        active, held = set(), []
        for lease in leases:
            if lease.get("held") is not None or lease.get("state") == "held":
                held.append(f'{lease.get("ip")} ({(lease.get("pod") or {}).get("name")})')
            else:
                active.add(lease.get("ip"))
        want = by_node.get(node, set())
        lines.append((active == want and not held,
                      f"{node}: store active {sorted(active)} held {held}; pods there {sorted(want)}"))
    if args.pps:
        by_name = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        n = 0
        for pps in load(args.pps)["items"]:
            ns = pps["metadata"]["namespace"]
            for name, rec in (pps.get("status", {}).get("podStates") or {}).items():
                n += 1
                pod = by_name.get((ns, name))
                if pod is None or pod.get("status", {}).get("phase") != "Running":
                    continue
                ok = rec.get("nodeName") == pod["spec"].get("nodeName") and \
                    set(pod_ips(pod)) <= set(rec.get("podIPs") or [])
                if not ok:
                    lines.append((False, f'record {ns}/{name} says {rec.get("nodeName")} '
                                         f'{rec.get("podIPs")}, the pod is on '
                                         f'{pod["spec"].get("nodeName")} with {pod_ips(pod)}'))
        lines.append((True, f"{n} PersistentPodState records checked against their pods"))
    for ok, text in lines:
        print(("ok " if ok else "FAIL ") + text)
    return 0 if all(ok for ok, _ in lines) else 1


def records(args):
    for pps in load(args.pps)["items"]:
        ns = pps["metadata"]["namespace"]
        for name, rec in sorted((pps.get("status", {}).get("podStates") or {}).items()):
            print(f'{ns}/{name} {rec.get("nodeName")} {",".join(rec.get("podIPs") or [])}')
    return 0


def carried(args):
    def read(path):
        with open(path) as f:
            return {l.split()[0]: l.split()[1:] for l in f if l.strip()}
    before, after = read(args.before), read(args.after)
    lost = sorted(set(before) - set(after))
    changed = sorted(k for k in before if k in after and before[k] != after[k])
    ok = not lost and not changed
    print(("ok " if ok else "FAIL ") + f"{len(before)} records before, {len(after)} after; "
          f"lost {lost or 'none'}; changed {[(k, before[k], after[k]) for k in changed] or 'none'}")
    return 0 if ok else 1


def rebuilds(args):
    rows = []
    with open(args.tsv) as f:
        for line in f:
            c = line.rstrip("\n").split("\t")
            if len(c) >= 9:
                rows.append(c)
    phases = []
    for r in rows:
        if r[0] not in phases:
            phases.append(r[0])
    bad = 0
    print("phase      rebuilt  IP kept  node kept  timeouts  unpinned  create->Running s (median/max)  delete->Running s (median/max)")
    for ph in phases:
        rs = [r for r in rows if r[0] == ph]
        done = [r for r in rs if r[5] != "timeout"]
        kept = sum(1 for r in done if r[3] == r[5])
        node_kept = sum(1 for r in done if r[2] == r[4])
        unpinned = sum(1 for r in done if r[8] != "pinned")
        c2r = [float(r[6]) for r in done]
        d2r = [float(r[7]) for r in done]
        fmt = lambda xs: f"{statistics.median(xs):.1f}/{max(xs):.1f}" if xs else "-"
        print(f"{ph:<10} {len(rs):>7}  {kept:>7}  {node_kept:>9}  {len(rs) - len(done):>8}  "
              f"{unpinned:>8}  {fmt(c2r):>30}  {fmt(d2r):>30}")
        # What an upgrade guarantees is the node and the IP. A pod rebuilt while the admission
        # policy waits for the new controller's first plan is not pinned at admission; the
        # extender still puts it on its node (CHANGELOG.md, 0.3.0): counted, not a failure.
        bad += (len(rs) - len(done)) + (len(done) - kept) + (len(done) - node_kept)
        slow = [r for r in done if float(r[6]) > args.slow]
        bad += len(slow)
        for r in slow:
            print(f"  slow: {r[1]} took {r[6]} s from creation to Running")
        for r in rs:
            if r[5] == "timeout" or r[3] != r[5] or r[2] != r[4] or r[8] != "pinned":
                print(f"  {r[1]}: {r[2]} {r[3]} -> {r[4]} {r[5]} ({r[8]})")
    total = len(rows)
    kept = sum(1 for r in rows if r[3] == r[5])
    print(f"total: {total} pods rebuilt, {kept} kept their IP")
    pinned = sum(1 for r in rows if r[8] == "pinned")
    print(f"pinned at admission: {pinned} of {total}")
    print(("ok " if bad == 0 and total > 0 else "FAIL ")
          + f"every rebuilt pod came back on its node with its IP within {args.slow} s "
          f"({total - kept} did not keep the IP, {bad} findings)")
    return 0 if bad == 0 and total > 0 else 1


def plugin(args):
    bad = 0
    for spec in args.log:
        node, path = spec.split("=", 1)
        samples, failures, seq = 0, [], []
        with open(path) as f:
            for line in f:
                parts = line.split(None, 2)
                if not parts:
                    continue
                samples += 1
                if parts[0] == "ok":
                    if not seq or seq[-1] != parts[1]:
                        seq.append(parts[1])
                else:
                    failures.append(line.strip())
        bad += len(failures) + (samples == 0)
        print(("ok " if not failures and samples else "FAIL ")
              + f"{node}: /opt/cni/bin/ipkeep answered VERSION in {samples - len(failures)} of "
              f"{samples} samples; binaries seen in turn: {' -> '.join(seq) or 'none'}"
              + "".join(f"; {x}" for x in failures[:5]))
    return 0 if bad == 0 else 1


def conflist(args):
    conf = load(args.input)
    main = conf["plugins"][0]
    ipam = main.get("ipam", {})
    main["ipam"] = {"type": "host-local", "ranges": ipam.get("ranges", []),
                    "routes": ipam.get("routes", [])}
    caps = main.get("capabilities") or {}
    caps.pop("io.kubernetes.cri.pod-annotations", None)
    if caps:
        main["capabilities"] = caps
    else:
        main.pop("capabilities", None)
    print(json.dumps(conf, indent=2))
    return 0


def crd(args):
    got, want = load(args.got), load(args.want)

    def norm(v):
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        return v
    served = {v["name"]: norm(v.get("schema")) for v in got["spec"]["versions"]}
    wanted = {v["name"]: norm(v.get("schema")) for v in want["spec"]["versions"]}
    ok = served == wanted
    differ = sorted(n for n in set(served) | set(wanted) if served.get(n) != wanted.get(n))
    print(("ok " if ok else "FAIL ") + f"the served CRD's versions {sorted(served)} "
          + ("have the chart's schemas" if ok else f"differ from the chart's in {differ}"))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("audit")
    a.add_argument("--pods", required=True)
    a.add_argument("--pps")
    a.add_argument("--store", action="append")
    r = sub.add_parser("records")
    r.add_argument("--pps", required=True)
    c = sub.add_parser("carried")
    c.add_argument("--before", required=True)
    c.add_argument("--after", required=True)
    b = sub.add_parser("rebuilds")
    b.add_argument("--tsv", required=True)
    b.add_argument("--slow", type=float, default=20.0)
    p = sub.add_parser("plugin")
    p.add_argument("--log", action="append", required=True)
    k = sub.add_parser("conflist")
    k.add_argument("--in", dest="input", required=True)
    d = sub.add_parser("crd")
    d.add_argument("--got", required=True)
    d.add_argument("--want", required=True)
    args = ap.parse_args()
    return {"audit": audit, "records": records, "carried": carried, "rebuilds": rebuilds,
            "plugin": plugin, "conflist": conflist, "crd": crd}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

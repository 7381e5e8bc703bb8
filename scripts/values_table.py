"""The chart README's table of values, generated from charts/ipkeep/values.yaml (defaults, and
the comment above each key) and values.schema.json (which keys are sections and which are
values: an object the schema describes key by key is a section, anything else a value). The
table sits between the README's two marker comments; everything else there is hand-written.

    python3 scripts/values_table.py            # rewrite the table in charts/ipkeep/README.md
    python3 scripts/values_table.py --check    # fail when it is stale (scripts/validate-deploy.sh)

Needs PyYAML (the virtualenv of scripts/validate-deploy.sh has it).
"""

import json
import os
import re
import sys

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CHART = os.path.join(ROOT, "charts", "ipkeep")
README = os.path.join(CHART, "README.md")
START = "<!-- values-table: start (scripts/values_table.py writes this table; do not edit) -->"
END = "<!-- values-table: end -->"
KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):")


def comments(text):
    """{dotted path: the comment right above its key}, from values.yaml's layout."""
    out, stack, pending = {}, [], []
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        if not stripped:
            pending = []
            continue
        m = KEY.match(line)
        if not m or stripped.startswith("-"):
            pending = []
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [m.group(2)])
        stack.append((indent, m.group(2)))
        if pending:
            out[path] = " ".join(pending)
        pending = []
    return out


def rows(schema, node, values, path, notes):
    """(path, default, description) of every value under `node`, in values.yaml's order: an
    object the schema describes inline, key by key, is a section (a row for its own comment,
    if any, then its keys); anything else, shared definitions ($ref) included, is a value."""
    props = node.get("properties")
    if "$ref" not in node and node.get("additionalProperties") is False and props \
            and isinstance(values, dict):
        if path and notes.get(path):
            yield path, None, notes[path]
        for key in values:
            sub = f"{path}.{key}" if path else key
            yield from rows(schema, props.get(key, {}), values.get(key), sub, notes)
        return
    yield path, values, notes.get(path, "")


def cell(text):
    return text.replace("|", "\\|").replace("\n", " ")


def table():
    with open(os.path.join(CHART, "values.yaml")) as f:
        raw = f.read()
    with open(os.path.join(CHART, "values.schema.json")) as f:
        schema = json.load(f)
    values = yaml.safe_load(raw)
    notes = comments(raw)
    lines = ["| value | default | what it does |", "|---|---|---|"]
    for path, default, text in rows(schema, schema, values, "", notes):
        shown = "" if default is None else f"`{cell(json.dumps(default, separators=(', ', ': ')))}`"
        lines.append(f"| `{path}` | {shown} | {cell(text)} |")
    return "\n".join(lines) + "\n"


def main(argv):
    with open(README) as f:
        readme = f.read()
    if START not in readme or END not in readme:
        raise SystemExit(f"values_table: {README} has no {START!r} ... {END!r} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    fresh = head + START + "\n\n" + table() + "\n" + END + tail
    if "--check" in argv[1:]:
        if fresh != readme:
            print("values_table: the values table in charts/ipkeep/README.md is stale; fix: "
                  "python3 scripts/values_table.py (then commit the README)")
            sys.exit(1)
        print("values_table: charts/ipkeep/README.md's values table is current")
        return
    if fresh != readme:
        with open(README, "w") as f:
            f.write(fresh)
        print("values_table: wrote the values table of charts/ipkeep/README.md")
    else:
        print("values_table: the values table is current")


if __name__ == "__main__":
    main(sys.argv)

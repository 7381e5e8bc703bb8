#!/usr/bin/env python3
"""Turns cargo's progress bar into log lines (scripts/lib/cargo-env.sh): reads the stderr of a
`cargo build` run with CARGO_TERM_PROGRESS_WHEN=always (the bar redrawn after a carriage return)
and writes, every INTERVAL seconds while it builds, one line

  LABEL: 57/312 compiled, 60 s (now: ring(build), tokio)

and at the end how many crates it compiled ("Compiling" lines; 0 when all was up to date) and in
how long. Every other line (warnings, errors, Finished, downloads) passes through unchanged.

  cargo build ... 2>&1 | cargo-progress.py LABEL [INTERVAL]
"""

import os
import re
import select
import sys
import time

BAR = re.compile(r"^\s*Building \[[^\]]*\] (\d+)/(\d+): ?(.*)$")
COMPILING = re.compile(r"^\s*Compiling ")


def main():
    label = sys.argv[1]
    interval = float(sys.argv[2]) if len(sys.argv) > 2 else 15
    started = time.monotonic()
    next_line = started + interval
    compiled = 0
    last = None
    buf = ""
    fd = sys.stdin.fileno()
    while True:
        # Wake up at least once per interval: a long step (the last crates' linking with
        # link-time optimisation) may redraw nothing for minutes.
        ready, _, _ = select.select([fd], [], [], max(0.1, next_line - time.monotonic()))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk.decode("utf-8", "replace")
            parts = re.split(r"[\r\n]", buf)
            buf = parts.pop()
            for part in parts:
                bar = BAR.match(part)
                if bar:
                    last = bar.groups()
                elif COMPILING.match(part):
                    compiled += 1
                elif part.strip():
                    print(part.rstrip(), flush=True)
        now = time.monotonic()
        if now >= next_line:
            if last:
                done, total, units = last
                units = units.strip()
                if len(units) > 60:
                    units = units[:57] + "..."
                print(f"{label}: {done}/{total} compiled, {int(now - started)} s"
                      + (f" (now: {units})" if units else ""), flush=True)
            next_line = now + interval
    if buf.strip() and not BAR.match(buf):
        print(buf.rstrip(), flush=True)
    took = int(time.monotonic() - started)
    if compiled:
        print(f"{label}: {compiled} crates compiled in {took} s", flush=True)
    else:
        print(f"{label}: nothing to compile (up to date), {took} s", flush=True)


if __name__ == "__main__":
    main()

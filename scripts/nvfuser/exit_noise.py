#!/usr/bin/env python3
"""Which test processes printed store or library warnings, per build: the quiet-exit check of the
nvFuser suites (scripts/nvfuser/suite.sh, scripts/nvfuser/main-suite.sh).

Usage: scripts/nvfuser/exit_noise.py RESULTS_DIR >>report.md

A rank that talks to the TCPStore after the rank hosting its server has gone prints c10d's
`recvValue failed ... Did the remote server shutdown or crash?` or `sendBytes failed ... Broken
pipe` with a stack trace, even when its test passed and it exits 0. The library's own warnings
(`NVFIPC WARN`, `NVFIPC ERROR`) count too. Every process log of the suite is read: the several-rank
tests (mr/, mr-alone/), the one-rank shards (test-*.txt) and the drivers (driver-*.txt). Prints a
Markdown section: per build, how many logs were read and which ones carry such lines (the first
matching line of each).
"""
import glob
import os
import re
import sys

NOISE = re.compile(
    r"\[c10d\] (recvValue|sendBytes|recvBytes) failed"
    r"|Did the remote server shutdown or crash"
    r"|Broken pipe"
    r"|NVFIPC (WARN|ERROR)"
)
BUILDS = ("stock", "ours")
# Process logs by build: file names carry the build as "-stock-" / "-ours-" or a "stock"/"ours"
# prefix after "test-" or "driver-".
LOG_GLOBS = ("mr/w*/*-{b}-rank*.txt", "mr-alone/w*/*-{b}-rank*.txt", "test-{b}-*.txt",
             "driver-{b}-*.txt")


def noisy_logs(res, build):
    """(logs read, [(path relative to res, first matching line)])."""
    paths = sorted({p for g in LOG_GLOBS for p in glob.glob(os.path.join(res, g.format(b=build)))
                    if not p.endswith("-exit.txt")})  # the drivers' exit times, not a process's
    found = []
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                if NOISE.search(line):
                    found.append((os.path.relpath(path, res), line.strip()[:160]))
                    break
    return len(paths), found


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print("usage: exit_noise.py RESULTS_DIR", file=sys.stderr)
        return 2
    res = sys.argv[1]
    print("\n## Exit: store and library warnings\n")
    print("c10d's `recvValue`/`sendBytes` failures, `Broken pipe`, and the library's `NVFIPC WARN`/"
          "`ERROR` lines, in every process log.\n")
    for build in BUILDS:
        read, found = noisy_logs(res, build)
        print(f"- {build}: {len(found)} of {read} process logs")
        for rel, line in found:
            print(f"  - `{rel}`: `{line}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())

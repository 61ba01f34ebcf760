"""Summarises a TIMING=1 run of tests/gpu/torch_lifecycle.py (one JSON line per rank): for each
part of a step, the median over ranks of its p50 in the first and the last 10% of the steps, and
their ratio; and how much each rank's memory and descriptors grew from the end of the first 10%
to the end. The library's part is `exchange_library` (the exchange call less the driver calls
made inside it). Usage: flat-report.py RUN.jsonl"""

import json
import re
import statistics
import sys


def reports(path):
    text = open(path).read()
    # mpirun may forward two ranks' lines without a newline between them.
    for chunk in re.findall(r'\{"rank".*?"seconds": [0-9.]+\}', text):
        yield json.loads(chunk)


def main(path):
    ranks = [r for r in reports(path) if "timing" in r]
    if not ranks:
        print(f"{path}: no timed rank report")
        return 1
    name = path.rsplit("/", 1)[-1].removesuffix(".jsonl")
    steps = ranks[0]["steps"]
    print(f"{name}: {len(ranks)} ranks, {steps} steps, p50 first 10% -> last 10% "
          "(median over ranks)")
    parts = ("step", "torch", "exchange", "exchange_driver", "exchange_library", "rest",
             "releaser_close")
    for part in parts:
        first = statistics.median(r["timing"][part]["first_us"] for r in ranks)
        last = statistics.median(r["timing"][part]["last_us"] for r in ranks)
        ratio = f"{last / first:.2f}x" if first else "-"
        print(f"  {part:<17} {first:>9.1f} us -> {last:>9.1f} us  {ratio}")
    for what in ("rss_mib", "fds", "torch_reserved_mib"):
        grew = [r["timing"]["process"]["end"][what]
                - r["timing"]["process"]["after_first_tenth"][what] for r in ranks]
        print(f"  {what:<17} grew per rank: median {statistics.median(grew):.1f}, "
              f"max {max(grew):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

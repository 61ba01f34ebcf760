#!/usr/bin/env python3
"""Summarises scripts/nvfuser/suite.sh's logs as the Markdown table of docs/nvfuser-suite.md.

Usage: scripts/nvfuser/suite-report.py RESULTS_DIR "2 4 8"

Rows: the tests of test_multidevice run with one rank (a suite whose tests have the same results
stock and ours is one row `Suite.* (N tests)` with the count of each result, except the suites
that reach IpcHandleCache or the kCuda backend, which get a row per test), then every scenario of
the host-IR driver per process count, then the tests run with several ranks on the one GPU
(scripts/lib/multi-rank-tests.sh; a row per test and world size, its result on every rank, or
`a/b/...` when the ranks differ). Results: pass, fail, skip, n/a (not reached or not run).
"""
import collections
import glob
import os
import re
import sys

RUN = re.compile(r"^\[ RUN      \] (\S+)")
END = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+)(?: \(\d+ ms\))?$")
WORD = {"OK": "pass", "FAILED": "fail", "SKIPPED": "skip"}
# Suites whose tests reach IpcHandleCache or CommunicatorBackend::kCuda: always one row per test.
KEY = re.compile(r"Ipc|P2P|HostIr|CudaComm|MultiDeviceTest$|StreamOp")


def gtest_results(paths):
    """test name -> pass/fail/skip; a test that started but never ended (crash, timeout) fails."""
    results = {}
    for path in paths:
        started = None
        with open(path, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                m = RUN.match(line)
                if m:
                    started = m.group(1)
                    continue
                m = END.match(line)
                if m and "." in m.group(2) and not m.group(2).endswith("tests,"):
                    name = m.group(2)
                    # gtest repeats FAILED lines in its summary; the first verdict counts.
                    results.setdefault(name, WORD[m.group(1)])
                    if name == started:
                        started = None
        if started is not None and started not in results:
            results[started] = "fail"
    return results


def driver_results(res, label, w):
    """(ran, scenario -> pass/fail, scenario -> us per iteration) of one driver run; a scenario
    passes only when every rank passed it."""
    ranks = sorted(glob.glob(os.path.join(res, f"driver-{label}-{w}-rank*.txt")))
    passed = collections.Counter()
    timings = {}
    for path in ranks:
        with open(path, errors="replace") as f:
            for line in f:
                m = re.match(r"RESULT rank=\S+ scenario=(\S+) PASS", line)
                if m:
                    passed[m.group(1)] += 1
                m = re.match(r"TIMING scenario=(\S+) ranks=\d+ iters=\d+ us_per_iter=(\S+)", line)
                if m:
                    timings[m.group(1)] = float(m.group(2))
    results = {s: ("pass" if n == len(ranks) else "fail") for s, n in passed.items()}
    return bool(ranks), results, timings


SCENARIOS = ["share_ipc_mem_handles", "cuda_comm", "ring_cached", "ring_alternating",
             "exchange_cached", "exchange_alternating", "extra_evaluator"]


def scenario_cells(ran, results):
    """Per scenario: its result; the first scenario without one failed (the driver stops at its
    first failure), the ones after it were not reached (n/a)."""
    cells, stopped = {}, False
    for s in SCENARIOS:
        if not ran or stopped:
            cells[s] = "n/a"
        elif s in results:
            cells[s] = results[s]
        else:
            cells[s], stopped = "fail", True
    return cells


def main():
    res, ranks = sys.argv[1], sys.argv[2].split()
    stock = gtest_results(sorted(glob.glob(os.path.join(res, "test-stock-*.txt"))))
    ours = gtest_results(sorted(glob.glob(os.path.join(res, "test-ours-*.txt"))))
    names = sorted(set(stock) | set(ours))
    by_suite = collections.OrderedDict()
    for n in names:
        by_suite.setdefault(n.split(".")[0], []).append(n)

    print("| test | ranks | GPUs | stock | ours |")
    print("|---|---|---|---|---|")
    totals = collections.Counter()
    regressions = []
    ours_not_passing = []
    for suite, tests in by_suite.items():
        pairs = [(stock.get(t, "n/a"), ours.get(t, "n/a")) for t in tests]
        for t, (s, o) in zip(tests, pairs):
            totals[("stock", s)] += 1
            totals[("ours", o)] += 1
            if s == "pass" and o != "pass":
                regressions.append(t)
        if set(pairs) == {pairs[0]} or (all(a == b for a, b in pairs) and not KEY.search(suite)):
            # Identical results stock and ours: one row, with the count of each result.
            counts = collections.Counter(s for s, _ in pairs)
            cell = ", ".join(f"{r} ({n})" for r, n in sorted(counts.items()))
            print(f"| `{suite}.*` ({len(tests)} tests) | 1 | 1 | {cell} | {cell} |")
        else:
            for t, (s, o) in zip(tests, pairs):
                print(f"| `{t}` | 1 | 1 | {s} | {o} |")

    for wdir in sorted(glob.glob(os.path.join(res, "mr", "w*")), key=lambda d: int(d.rsplit("w", 1)[1])):
        world = int(wdir.rsplit("w", 1)[1])
        listed = os.path.join(res, f"mr-list-w{world}.txt")
        tests = [l.strip() for l in open(listed) if l.strip()] if os.path.exists(listed) else []
        for n, test in enumerate(tests, 1):
            cells = []
            for label in ("stock", "ours"):
                per_rank = [gtest_results([f]).get(test, "n/a")
                            for f in sorted(glob.glob(os.path.join(wdir, f"{n}-{label}-rank*.txt")))]
                cells.append(per_rank[0] if per_rank and len(set(per_rank)) == 1
                             else "/".join(per_rank) or "n/a")
            if cells[0] == "pass" and cells[1] != "pass":
                regressions.append(f"{test} (W={world})")
            if cells[1] != "pass":
                ours_not_passing.append(f"{test} (W={world}: {cells[1]}; stock {cells[0]})")
            print(f"| `{test}` | {world} | 1 | {cells[0]} | {cells[1]} |")

    timing_rows = []
    for w in ranks:
        stock_ran, stock_d, _ = driver_results(res, "stock", w)
        ours_ran, ours_d, ours_t = driver_results(res, "ours", w)
        st_cells = scenario_cells(stock_ran, stock_d)
        ou_cells = scenario_cells(ours_ran, ours_d)
        for s in SCENARIOS:
            print(f"| `nvfipc_hostir_driver` {s} | {w} | 1 | {st_cells[s]} | {ou_cells[s]} |")
        _, _, stock_t = driver_results(res, "stock", w)
        timing_rows += [(s, w, stock_t.get(s), us) for s, us in ours_t.items()]

    print()
    if totals:
        print("Single-rank totals: stock " +
              ", ".join(f"{k[1]} {v}" for k, v in sorted(totals.items()) if k[0] == "stock") +
              "; ours " +
              ", ".join(f"{k[1]} {v}" for k, v in sorted(totals.items()) if k[0] == "ours") + ".")
    else:
        print("Single-rank run: not in this run (SINGLE_RANK=0).")
    print("Tests stock passes and ours does not: " + (", ".join(regressions) or "none") + ".")
    print("Several-rank tests ours does not pass (stock n/a: stock not built in this run): " +
          (", ".join(ours_not_passing) or "none") + ".")
    if timing_rows:
        print()
        print("| driver scenario | processes | stock: us per iteration (rank 0) | ours | ours / stock |")
        print("|---|---|---|---|---|")
        for s, w, st, us in timing_rows:
            st_cell = f"{st:.1f}" if st is not None else "n/a"
            ratio = f"{us / st:.2f}x" if st else "n/a"
            print(f"| {s} | {w} | {st_cell} | {us:.1f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Plots of a GPU round's results for docs/BENCHMARKS.md, as self-contained SVG (no plotting
library needed): time against the number of ranks, log-log, one line per series.

    python3 scripts/bench/curves.py scale DIR OUT.svg
        per-call p50 of the ring exchange (warm and pool, ours and the seed protocol) at every
        W found in DIR/exchange.json and DIR/scale.json (cudaMalloc buffers), and the pool over
        VMM buffers from DIR/exchange-vmm.json
    python3 scripts/bench/curves.py symmetric DIR DRIVERS OUT.svg
        the symmetric set-up inside nvFuser main, stock `setupRemoteHandles` against ours
        (DRIVERS/driver-{stock,ours}-wW-round-2.txt, RESULT lines of nvfipc_main_driver), and the
        library's own first rendezvous over VMM buffers (DIR/symmetric-vmm.json)
    python3 scripts/bench/curves.py first-touch DIR STOCK.csv OUT.svg
        first touches against W: a process's first VMM rendezvous, its floor and a fresh
        rendezvous (DIR/symmetric-vmm.json), cold exchanges of fresh 8 MiB allocations, their
        floor and floor + the closes they cause (DIR/exchange.json), and stock nvFuser main's
        symmetric set-up (STOCK.csv: lines "world,milliseconds")
"""
import glob
import json
import math
import os
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def svg(title, ylabel, series, out):
    """series: [(label, dashed, [(w, seconds)])] -> a log-log SVG at `out`."""
    pts = [p for _, _, s in series for p in s]
    xs = sorted({w for w, _ in pts})
    lo = 10 ** math.floor(math.log10(min(v for _, v in pts)))
    hi = 10 ** math.ceil(math.log10(max(v for _, v in pts)))
    W, H, L, R, T, B = 720, 420, 80, 210, 40, 50
    x = lambda w: L + (math.log2(w) - math.log2(xs[0])) / max(1e-9, math.log2(xs[-1]) - math.log2(xs[0])) * (W - L - R)
    y = lambda v: T + (math.log10(hi) - math.log10(v)) / (math.log10(hi) - math.log10(lo)) * (H - T - B)
    unit = lambda v: f"{v * 1e6:g} us" if v < 1e-3 else f"{v * 1e3:g} ms"
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
         f'<text x="16" y="{(H - B + T) / 2}" transform="rotate(-90 16 {(H - B + T) / 2})" text-anchor="middle">{ylabel}</text>',
         f'<text x="{(W - R + L) / 2}" y="{H - 10}" text-anchor="middle">ranks (W, processes on one H200)</text>']
    d = lo
    while d <= hi * 1.0001:
        o.append(f'<line x1="{L}" x2="{W - R}" y1="{y(d):.1f}" y2="{y(d):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 6}" y="{y(d) + 4:.1f}" text-anchor="end">{unit(d)}</text>')
        d *= 10
    for w in xs:
        o.append(f'<line x1="{x(w):.1f}" x2="{x(w):.1f}" y1="{T}" y2="{H - B}" stroke="#eee"/>')
        o.append(f'<text x="{x(w):.1f}" y="{H - B + 16}" text-anchor="middle">{w}</text>')
    for i, (label, dashed, s) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        s = sorted(s)
        path = " ".join(f"{x(w):.1f},{y(v):.1f}" for w, v in s)
        dash = ' stroke-dasharray="6,4"' if dashed else ""
        o.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
        for w, v in s:
            o.append(f'<circle cx="{x(w):.1f}" cy="{y(v):.1f}" r="3" fill="{c}"><title>{label}, W={w}: {unit(v)}</title></circle>')
        ly = T + 10 + 20 * i
        o.append(f'<line x1="{W - R + 12}" x2="{W - R + 40}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="2"{dash}/>')
        o.append(f'<text x="{W - R + 46}" y="{ly + 4}">{label}</text>')
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


def exchange_points(paths, key):
    pts = []
    for p in paths:
        for row in json.load(open(p)).get("exchange", []):
            s = row["series"].get(key)
            if s:
                pts.append((row["world"], s["median_ns"] * 1e-9))
    return pts


def scale(d, out):
    legacy = [os.path.join(d, "exchange.json"), os.path.join(d, "scale.json")]
    vmm = [os.path.join(d, "exchange-vmm.json")]
    svg("Ring exchange per call (two comms), p50", "time per call", [
        ("ours, warm", False, exchange_points(legacy, "ours.warm")),
        ("ours, pool", False, exchange_points(legacy, "ours.pool")),
        ("ours, pool (VMM)", False, exchange_points(vmm, "ours.pool")),
        ("seed, warm", True, exchange_points(legacy, "seed.warm")),
        ("seed, pool", True, exchange_points(legacy, "seed.pool")),
    ], out)


def symmetric(d, drivers, out):
    def setup(label):
        pts = []
        for f in glob.glob(os.path.join(drivers, f"driver-{label}-w*-round-2.txt")):
            for line in open(f):
                if "scenario=symmetric_setup" in line:
                    kv = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
                    pts.append((int(kv["world"]), float(kv["exchange_median_us"]) * 1e-6))
        return pts
    lib = [(r["world"], r["first_median_ns"] * 1e-9)
           for r in json.load(open(os.path.join(d, "symmetric-vmm.json")))["symmetric"]]
    svg("Symmetric set-up: every rank maps every other rank", "time (median over ranks)", [
        ("nvFuser main, stock", True, setup("stock")),
        ("nvFuser main, ours", False, setup("ours")),
        ("library rendezvous (VMM)", False, lib),
    ], out)


def first_touch(d, stock, out):
    rows = json.load(open(os.path.join(d, "symmetric-vmm.json")))["symmetric"]
    symm = lambda key: [(r["world"], r[key] * 1e-9) for r in rows if r.get(key)]
    ex = json.load(open(os.path.join(d, "exchange.json")))["exchange"]
    med = lambda r, k: r["series"].get(k, {}).get("median_ns")
    closes = [(r["world"], (r["floor_large_ns"] + med(r, "floor_large.closes")) * 1e-9)
              for r in ex if r.get("floor_large_ns") and med(r, "floor_large.closes")]
    nvf = [(int(w), float(ms) * 1e-3) for w, ms in
           (line.strip().split(",") for line in open(stock) if line[:1].isdigit())]
    svg("First touches against W (one H200)", "time (median over ranks)", [
        ("first VMM rendezvous", False, symm("first_contact_median_ns")),
        ("its floor", True, symm("floor_median_ns")),
        ("fresh VMM rendezvous", False, symm("first_median_ns")),
        ("cold 8 MiB exchange", False, exchange_points([os.path.join(d, "exchange.json")], "ours.cold_large")),
        ("its floor + closes", True, closes),
        ("nvFuser main, stock set-up", True, nvf),
    ], out)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "scale" and len(sys.argv) == 4:
        scale(sys.argv[2], sys.argv[3])
    elif what == "first-touch" and len(sys.argv) == 5:
        first_touch(sys.argv[2], sys.argv[3], sys.argv[4])
    elif what == "symmetric" and len(sys.argv) == 5:
        symmetric(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)

#!/usr/bin/env python3
"""Draws the snapshot stall against memcpy, by state size, from checkpoint_bench's JSON output.

    checkpoint_bench --benchmark_filter=stall --benchmark_out=out.json --benchmark_out_format=json
    benchmarks/plot_stall.py out.json docs/snapshot-stall.svg

Plain SVG, no plotting library needed."""
import json
import math
import sys


def main(src, dst):
    rows = []
    for b in json.load(open(src))["benchmarks"]:
        if b["name"].startswith("BM_snapshot_stall/") and b.get("run_type", "iteration") == "iteration":
            mib = int(b["name"].split("/")[1])
            rows.append((mib, b["stall_ms"], b["memcpy_ms"]))
    rows.sort()
    if not rows:
        sys.exit("no BM_snapshot_stall rows in " + src)
    w, h, left, bottom, top, right = 560, 340, 70, 50, 30, 150
    xs = [math.log2(r[0]) for r in rows]
    ymax = max(max(r[1], r[2]) for r in rows) * 1.15
    ly = lambda v: top + (h - top - bottom) * (1 - math.log10(max(v, 0.1)) / math.log10(ymax)) if ymax > 1 else h - bottom
    lx = lambda x: left + (w - left - right) * (x - xs[0]) / max(xs[-1] - xs[0], 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="14">Snapshot stall vs memcpy of the same bytes (CPU build)</text>',
           f'<line x1="{left}" y1="{h-bottom}" x2="{w-right}" y2="{h-bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h-bottom}" stroke="black"/>',
           f'<text x="{(left + w - right) / 2}" y="{h-12}" text-anchor="middle">state size (MiB, log scale)</text>',
           f'<text x="16" y="{(top + h - bottom) / 2}" transform="rotate(-90 16 {(top + h - bottom) / 2})" text-anchor="middle">ms (log scale)</text>']
    for r, x in zip(rows, xs):
        out.append(f'<text x="{lx(x)}" y="{h-bottom+16}" text-anchor="middle">{r[0]}</text>')
    for v in (1, 10, 100, 1000):
        if v < ymax:
            out.append(f'<text x="{left-6}" y="{ly(v)+4}" text-anchor="end">{v}</text>')
            out.append(f'<line x1="{left}" y1="{ly(v)}" x2="{w-right}" y2="{ly(v)}" stroke="#ddd"/>')
    for idx, colour, label in ((2, "#888", "memcpy (limit)"), (1, "#c33", "elastic stall")):
        pts = " ".join(f"{lx(x)},{ly(r[idx])}" for r, x in zip(rows, xs))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for r, x in zip(rows, xs):
            out.append(f'<circle cx="{lx(x)}" cy="{ly(r[idx])}" r="3" fill="{colour}"/>')
        y = top + 20 + (0 if idx == 2 else 20)
        out.append(f'<line x1="{w-right+15}" y1="{y-4}" x2="{w-right+35}" y2="{y-4}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{w-right+40}" y="{y}">{label}</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

#!/usr/bin/env python3
"""Plots a curve from an `ownerserve bench ...` Markdown table read on stdin, for
docs/BENCHMARKS.md: one line per series (rows grouped by a column), x and y picked by
header text. A cell like "41.2 / 63.9" gives its first number, or the one at `--part`
(or at `K` for a `--y "header#K"`, so one plot can take different numbers of cells).
Needs matplotlib (`pip install matplotlib`); the benches themselves do not.

    ownerserve bench planner --workers 8,64,256,1024 | scripts/plot_bench.py \\
        --x workers --y "plan alone" --series decision --out docs/plots/planner.png
"""
import argparse
import re
import sys

NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def number(cell, part):
    found = NUMBER.findall(cell)
    if len(found) <= part:
        return None
    return float(found[part].replace(",", ""))


def table(lines, want):
    """The rows (dicts by header) of the first table whose header has column `want`."""
    header, rows = None, []
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            if header and rows:
                break
            header = None
            continue
        if header is None:
            header = cells if any(want in c for c in cells) else None
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells)))
    return rows


def column(row, name):
    return next((v for k, v in row.items() if name in k), "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--x", required=True, help="header text of the x column")
    ap.add_argument("--y", required=True, action="append",
                    help="header text of a y column, optionally #K: the cell's K-th number")
    ap.add_argument("--part", type=int, default=0, help="which number of a y cell")
    ap.add_argument("--series", help="header text of the column naming each line")
    ap.add_argument("--title", default="")
    ap.add_argument("--ylabel", default="")
    ap.add_argument("--log", action="store_true", help="log-log axes")
    ap.add_argument("--bars", action="store_true",
                    help="grouped bars: the x column's cells as categories, a bar per y column")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = table(sys.stdin.read().splitlines(), args.x)
    if not rows:
        sys.exit(f"no table with a '{args.x}' column on stdin")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    if args.bars:
        cats = [column(r, args.x) for r in rows]
        width = 0.8 / len(args.y)
        for i, y in enumerate(args.y):
            ys = [number(column(r, y), args.part) or 0 for r in rows]
            ax.bar([c + i * width for c in range(len(cats))], ys, width, label=y)
        ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cats))])
        ax.set_xticklabels([c[:28] for c in cats], fontsize=7)
    for y in [] if args.bars else args.y:
        part, shown = args.part, y
        if "#" in y:
            y, k = y.rsplit("#", 1)
            part = int(k)
        lines = {}
        for r in rows:
            label = column(r, args.series) if args.series else ""
            if len(args.y) > 1 or not label:
                label = f"{shown}: {label}" if label else shown
            point = (number(column(r, args.x), 0), number(column(r, y), part))
            if None not in point:
                lines.setdefault(label, []).append(point)
        for label, pts in lines.items():
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker="o", label=label[:70])
    if args.log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel(args.x)
    ax.set_ylabel(args.ylabel or " / ".join(args.y))
    ax.set_title(args.title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A session's E2E split into its TTFTs, its decodes and the rest (tool gaps).

Reads the per-step CSV that `eval_cli simulate --steps-csv` writes (one file per policy).
Per session: E2E is its first issue to its last token; TTFT is the sum of its steps'
TTFTs; decode is the sum of latency - TTFT (first to last token); the rest is the time
no step of it was in flight. Prints the means over sessions, over the steps served
(rejected steps have no TTFT and are left out).

docs/EVALUATION.md, seventeenth pass: the floor an E2E target is measured against is the
fleet's gaps + the bound's TTFT + the pooled relaxation's decode.

    python3 scripts/e2e_split.py /tmp/lca-ownerserve.csv /tmp/lca-bound.csv
"""

import argparse
import csv
import math
import sys
from collections import defaultdict


def number(text: str):
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="steps CSVs from simulate --steps-csv")
    args = ap.parse_args()
    for path in args.csv:
        sessions = defaultdict(lambda: {"ttft": 0.0, "decode": 0.0, "start": None, "end": 0.0})
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                s = sessions[row["session"]]
                issued = float(row["issued_s"])
                s["start"] = issued if s["start"] is None else min(s["start"], issued)
                ttft, latency = number(row["ttft_s"]), number(row["latency_s"])
                if ttft is None or latency is None:
                    continue
                s["ttft"] += ttft
                s["decode"] += latency - ttft
                s["end"] = max(s["end"], issued + latency)
        if not sessions:
            print(f"{path}: no steps", file=sys.stderr)
            continue
        n = len(sessions)
        mean = lambda key: sum(s[key] for s in sessions.values()) / n
        e2e = sum(s["end"] - s["start"] for s in sessions.values()) / n
        ttft, decode = mean("ttft"), mean("decode")
        print(f"{path}: {n} sessions, per session: E2E {e2e:.1f} s = rest {e2e - ttft - decode:.2f}"
              f" + TTFT {ttft:.2f} + decode {decode:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

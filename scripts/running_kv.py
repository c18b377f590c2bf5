#!/usr/bin/env python3
"""How often the sequences running at once need more KV than a fleet's pool.

Reads the per-step CSV that `eval_cli simulate --steps-csv` writes (one file per policy).
A step holds its prompt's KV from its admission (`issued_s + admit_wait_s`) to its last
token (`issued_s + latency_s`). Prints the mean and peak of the running steps' prompt
tokens, the share of the run's time they exceed `--pool-tokens`, and the share of steps
issued while they do.

Used on a run with more memory than the fleet has (a GPU preset with a larger
`memory_gb`): if its running sequences would not fit in the real pool, a router cannot
make them fit. docs/EVALUATION.md, sixteenth pass, "What bounds the `8h` rows".

    python3 scripts/running_kv.py /tmp/m-330-h100-400gb-ownerserve.csv --pool-tokens 3414272
"""

import argparse
import bisect
import csv
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="steps CSVs from simulate --steps-csv")
    ap.add_argument("--pool-tokens", type=int, required=True,
                    help="the fleet's KV pool in tokens (sum over workers)")
    args = ap.parse_args()
    for path in args.csv:
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["latency_s"] not in ("", "NaN")]
        served = [r for r in rows if float(r["latency_s"]) > 0.0]
        if not served:
            print(f"{path}: no served step")
            continue
        events = []
        for r in served:
            issued = float(r["issued_s"])
            tokens = int(r["prompt_tokens"])
            events.append((issued + float(r["admit_wait_s"]), tokens))
            events.append((issued + float(r["latency_s"]), -tokens))
        events.sort()
        times, levels, level = [], [], 0
        for t, delta in events:
            level += delta
            times.append(t)
            levels.append(level)
        span = times[-1] - times[0]
        area = over = 0.0
        for i in range(len(times) - 1):
            dt = times[i + 1] - times[i]
            area += levels[i] * dt
            if levels[i] > args.pool_tokens:
                over += dt
        issued_over = 0
        for r in served:
            i = bisect.bisect_right(times, float(r["issued_s"])) - 1
            if i >= 0 and levels[i] > args.pool_tokens:
                issued_over += 1
        print(
            f"{path}: running prompt tokens mean {area / span:,.0f}, peak {max(levels):,}; "
            f"over {args.pool_tokens:,} for {100 * over / span:.1f}% of {span:.0f} s; "
            f"{issued_over} of {len(served)} steps "
            f"({100 * issued_over / len(served):.1f}%) issued then"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Issue 18's acceptance, tallied over the evaluation matrix as committed.

Reads the "Acceptance per row" tables that `eval_cli report --matrix` writes into
docs/eval/ for the default configuration: the agentic rows without a host tier
(`matrix-*-{2p6d,4p4d,8h}-agentic-dram0.md`) and the other workloads (`matrix-*-other.md`).
Prints, per criterion, how many rows pass, then every failing cell with its figures, so
the findings in docs/EVALUATION.md ("Where it stands") can be checked against the files.

    python3 scripts/acceptance_tally.py            # from the repository's root
    python3 scripts/acceptance_tally.py --dir docs/eval
"""

import argparse
import glob
import os
import sys

# The acceptance table's columns after workload, cluster and model.
CRITERIA = ["p99 TTFT", "E2E", "sessions held", "KV migrated", "dup."]


def acceptance_rows(path):
    """Each row of the file's acceptance table: its cells, split on '|'."""
    rows = []
    in_table = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## Acceptance per row"):
                in_table = True
                continue
            if in_table and line.startswith("## "):
                break
            if in_table and line.startswith("| ") and not line.startswith("| workload"):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="docs/eval", help="where the matrix files are")
    args = ap.parse_args()
    paths = sorted(glob.glob(os.path.join(args.dir, "matrix-*-agentic-dram0.md")))
    paths += sorted(glob.glob(os.path.join(args.dir, "matrix-*-other.md")))
    if not paths:
        print(f"no matrix files in {args.dir}", file=sys.stderr)
        return 1
    passed = {c: 0 for c in CRITERIA}
    judged = {c: 0 for c in CRITERIA}
    fails = []
    for path in paths:
        for cells in acceptance_rows(path):
            if len(cells) < 3 + len(CRITERIA):
                print(f"{path}: a row with {len(cells)} cells", file=sys.stderr)
                return 1
            row = " ".join(cells[:3])
            for name, cell in zip(CRITERIA, cells[3:]):
                if cell.startswith("PASS"):
                    passed[name] += 1
                    judged[name] += 1
                elif cell.startswith("FAIL"):
                    judged[name] += 1
                    fails.append((row, name, cell[len("FAIL "):]))
    for name in CRITERIA:
        print(f"{name}: {passed[name]}/{judged[name]} rows pass")
    print()
    for row, name, detail in fails:
        print(f"FAIL {name} | {row} | {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Issue 18's acceptance, tallied over the evaluation matrix as committed.

Reads the "Acceptance per row" tables that `eval_cli report --matrix` writes into
docs/eval/ for the default configuration: the agentic rows without a host tier
(`matrix-*-{2p6d,4p4d,8h}-agentic-dram0.md`) and the other workloads (`matrix-*-other.md`).
Prints, per criterion, how many rows pass, then every failing cell with its figures, so
the findings in docs/EVALUATION.md ("The matrix") can be checked against the files.

    python3 scripts/acceptance_tally.py            # from the repository's root
    python3 scripts/acceptance_tally.py --check docs/EVALUATION.md

`--check` fails (exit 1) when the "rows passing" column of that section's table, in
criterion order, is not what the files say: a matrix regenerated without its findings.
"""

import argparse
import glob
import os
import sys

# The acceptance table's columns after workload, cluster and model.
CRITERIA = ["p99 TTFT", "E2E", "sessions held", "KV migrated", "dup."]


def table_rows(path, heading):
    """The cells of each table line in the section whose heading starts with `heading`."""
    rows = []
    in_section = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                in_section = line.startswith(heading)
            elif in_section and line.startswith("| "):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def acceptance_rows(path):
    """Each row of the file's acceptance table (its header and rule left out)."""
    return [r for r in table_rows(path, "## Acceptance per row") if r[0] not in ("workload", "---")]


def stated_counts(path):
    """The "N / M" cells of the table in the "The matrix" section, in order."""
    return [r[1] for r in table_rows(path, "## The matrix: the no-regression rows") if len(r) > 1 and " / " in r[1]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="docs/eval", help="where the matrix files are")
    ap.add_argument("--check", metavar="EVALUATION_MD",
                    help="fail unless this file's \"The matrix\" table states these counts")
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
    if args.check:
        counted = [f"{passed[c]} / {judged[c]}" for c in CRITERIA]
        stated = stated_counts(args.check)
        if stated != counted:
            print(f"{args.check} states {stated}; the matrix files give {counted}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

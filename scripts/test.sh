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
# Two workers, a file each at a time (tests/conftest.py): the suite is mostly CPU-bound, so this
# is not reliably faster on two cores (1,452 and 1,786 s against 1,692 s in one process), but it
# runs every test beside a busy neighbour, which has found waits that read a plot twice.
# PAGEDLAB_TEST_WORKERS=0 runs in this one process; later arguments win (`-n 0`).
exec .venv/bin/python -m pytest -n "${PAGEDLAB_TEST_WORKERS:-2}" "$@"

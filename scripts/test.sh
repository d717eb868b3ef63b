#!/usr/bin/env bash
# The README's test command: set up .venv if needed, then lint and run every test, in two processes
# side by side (arguments go to one pytest instead: `bash scripts/test.sh -m "not slow"` runs the
# fast subset).
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
if [ "$#" -gt 0 ]; then
    echo "[test] pytest $*"
    exec .venv/bin/python -m pytest "$@"
fi
# The whole suite as two pytest processes side by side: one drives the browser and the served
# apps (tests/ui, tests/space, tests/viz), the other everything else. Run alone, the suite kept
# one of the two cores busy on average (user + system time 96% of its wall time: its browser
# tests wait on an app or the page while its model tests compute), and took 26-29 minutes.
# The default model is converted once before they start (both would otherwise convert it).
echo "[test] pytest, two processes"
.venv/bin/python -c "from engine.runtime.models import load_model; load_model('default', 'cpu', 'float32')"
BROWSER=(tests/ui tests/space tests/viz)
REST=()
for t in tests/*; do
    case "$t" in
        tests/ui|tests/space|tests/viz|tests/space_sim|tests/__pycache__) ;;
        tests/test_*.py) REST+=("$t") ;;
        *) [ -d "$t" ] && REST+=("$t") ;;
    esac
done
logs=$(mktemp -d)
.venv/bin/python -m pytest -p no:cacheprovider --basetemp="$logs/tmp-browser" "${BROWSER[@]}" \
    > "$logs/browser.log" 2>&1 &
browser_pid=$!
.venv/bin/python -m pytest -p no:cacheprovider --basetemp="$logs/tmp-rest" "${REST[@]}" \
    > "$logs/rest.log" 2>&1 &
rest_pid=$!
status=0
wait "$rest_pid" || status=1
wait "$browser_pid" || status=1
echo "[test] ===== ${REST[*]}"
cat "$logs/rest.log"
echo "[test] ===== ${BROWSER[*]}"
cat "$logs/browser.log"
[ "$status" = 0 ] && echo "[test] both parts passed" || echo "[test] a part failed"
exit "$status"

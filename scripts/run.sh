#!/usr/bin/env bash
# The README's run command: set up .venv if needed, then start the app on the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python app.py "$@"

#!/usr/bin/env bash
# README command (b): set up .venv/ if needed, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
scripts/ensure_venv.sh
exec .venv/bin/python -m pytest "$@"

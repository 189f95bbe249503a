#!/usr/bin/env bash
# README command (a): set up .venv/ if needed, then run the main job on its embedded default.
# Extra arguments are passed to `python -m dockyard.launch` (e.g. --config=configs/math.py).
set -euo pipefail
cd "$(dirname "$0")"
scripts/ensure_venv.sh
has_config=0; has_workdir=0
for a in "$@"; do
  case $a in --config=*|--config) has_config=1;; --workdir=*|--workdir) has_workdir=1;; esac
done
args=()
((has_config)) || args+=(--config=configs/swe.py)
((has_workdir)) || args+=(--workdir=workdirs/default)
exec .venv/bin/python -m dockyard.launch "${args[@]}" "$@"

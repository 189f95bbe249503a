"""One whole run through `python -m dockyard.launch` in a child process, as a user starts it, and
its metrics: shared by the integration tests of the launcher's non-GRPO runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(workdir: str, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
  """Runs the launcher with `args` into `workdir` (TensorBoard off); asserts it exits 0 (its output
  tails in the message otherwise) and returns it with the rows of its metrics.jsonl."""
  proc = subprocess.run([sys.executable, "-m", "dockyard.launch", f"--workdir={workdir}", *args,
                         "--config.logging.tensorboard=False"],
                        cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return proc, [json.loads(line) for line in f if line.strip()]

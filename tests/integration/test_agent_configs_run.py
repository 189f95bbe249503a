"""configs/terminal.py and configs/swe_agent.py start and finish one GRPO step through
`python -m dockyard.launch` with real parts (Ray, CPU vLLM, the JAX trainer, a local sandbox fleet):
episodes are played in sessions (agent/* metrics logged) and single-shot validation runs through
the agent env. Shortened (2 tasks x 2 episodes, 2 turns of 32 tokens); ~2 minutes each here, most
of it vLLM's start."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("config,metric", [("configs/terminal.py:tiny", "val/success_rate"),
                                           ("configs/swe_agent.py:tiny", "val/resolve_rate")])
def test_one_step_of_agent_episodes(config, metric, tmp_path):
  workdir = str(tmp_path / "run")
  proc = subprocess.run(
      [sys.executable, "-m", "dockyard.launch", f"--config={config}", f"--workdir={workdir}",
       "--config.grpo.max_num_steps=1", "--config.grpo.num_prompts_per_step=2",
       "--config.grpo.num_generations_per_prompt=2", "--config.grpo.max_val_samples=2",
       "--config.agent.max_turns=2", "--config.rollout.max_new_tokens=32"],
      cwd=ROOT, capture_output=True, text=True, timeout=900,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  train = [r for r in rows if "agent/turns" in r]
  assert len(train) == 1 and train[0]["agent/turns"] >= 1 and train[0]["agent/tokens"] > 0, rows
  assert any(metric in r for r in rows), rows

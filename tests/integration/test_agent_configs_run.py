"""configs/terminal.py and configs/swe_agent.py start and finish one GRPO step through
`python -m dockyard.launch` with real parts (Ray, CPU vLLM, the JAX trainer, a local sandbox fleet):
episodes are played in sessions (agent/* metrics logged), validation plays one episode per held-out
task, and (terminal) the SFT warm start plays every train task's oracle as an episode in a real
session, each passing its checker. Shortened (2 tasks x 2 episodes; SWE: 2 turns of 32 tokens; terminal: 2 SFT
steps); ~2 minutes each here, most of it vLLM's start."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("config,metric,extra", [
    # the terminal default's budgets, which every oracle fits
    ("configs/terminal.py:tiny", "val/success_rate", ["--config.grpo.sft_warmup.steps=2"]),
    ("configs/swe_agent.py:tiny", "val/resolve_rate", ["--config.agent.max_turns=2",
                                                       "--config.rollout.max_new_tokens=32"])])
def test_one_step_of_agent_episodes(config, metric, extra, tmp_path):
  workdir = str(tmp_path / "run")
  proc = subprocess.run(
      [sys.executable, "-m", "dockyard.launch", f"--config={config}", f"--workdir={workdir}",
       "--config.grpo.max_num_steps=1", "--config.grpo.num_prompts_per_step=2",
       "--config.grpo.num_generations_per_prompt=2", "--config.grpo.max_val_samples=2",
       *extra],
      cwd=ROOT, capture_output=True, text=True, timeout=900,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  train = [r for r in rows if "agent/turns" in r]
  assert len(train) == 1 and train[0]["agent/turns"] >= 1 and train[0]["agent/tokens"] > 0, rows
  assert any(metric in r for r in rows), rows
  if "terminal" in config:   # the oracle episodes of the 72 train tasks (3 families x 24), all passing their checker
    oracle = [r for r in rows if "sft/oracle_episodes" in r]
    assert oracle and oracle[0]["sft/oracle_episodes"] == 72 and oracle[0]["sft/oracle_failed"] == 0, oracle
    assert sum("sft/loss" in r for r in rows) == 2

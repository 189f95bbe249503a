"""bench/peer_trl.py --smoke: dockyard's GRPO loop and TRL's GRPOTrainer on the same tiny model.

Runs the bench as a user would (a fresh interpreter from the repo root, the session's environment
without the 8 fake JAX devices tests/conftest.py sets) and reads its JSON report: both sides ran
the requested steps, TRL trained on exactly dockyard's prompt order, both step times are real,
and the last stdout line is the RESULT line. Never the value: under CI load it means nothing.
The TRL side is cut off after its first step's checkpoint (DOCKYARD_PEER_TRL_STOP_AFTER=1, an
exit right after the save, as a kill would leave it) and the rerun into the same --workdir reuses
the dockyard side and resumes TRL from that checkpoint: the report must still show every step once,
in dockyard's prompt order, with TRL's reward history carried across the cut.
TRL is the `[bench]` extra, which scripts/ensure_venv.sh installs; the test skips only without it.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_DEVICES = "--xla_force_host_platform_device_count=8"
RESULT = re.compile(r"^RESULT speed_vs_trl -?[0-9]+\.[0-9]+ x$")


def user_env() -> dict[str, str]:
  env = dict(os.environ)
  if env.get("XLA_FLAGS") == FAKE_DEVICES:
    del env["XLA_FLAGS"]
  return env


@pytest.mark.slow
def test_peer_trl_smoke(tmp_path):
  try:   # the [bench] extra; CI installs it, so a missing or broken TRL fails here, never skips
    import trl  # noqa: F401
  except ImportError as e:
    pytest.fail(f"TRL is the [bench] extra (pip install -e '.[bench]'): {e}")
  report_path = tmp_path / "report.json"
  cmd = [sys.executable, "bench/peer_trl.py", "--smoke", f"--workdir={tmp_path / 'w'}", f"--report={report_path}"]

  def run(env):
    try:
      proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=800)
    except subprocess.TimeoutExpired as e:
      pytest.fail(f"`{' '.join(cmd[1:])}` ran past {e.timeout} s")
    return proc, f"--- stdout (tail) ---\n{proc.stdout[-3000:]}\n--- stderr (tail) ---\n{proc.stderr[-3000:]}"

  proc, tail = run({**user_env(), "DOCKYARD_PEER_TRL_STOP_AFTER": "1"})
  assert proc.returncode != 0 and "the trl side failed (exit 3)" in proc.stderr, tail
  assert (tmp_path / "w" / "dockyard.json").exists() and not (tmp_path / "w" / "trl.json").exists()
  proc, tail = run(user_env())
  assert proc.returncode == 0, f"bench/peer_trl.py --smoke exited {proc.returncode}\n{tail}"
  assert "the dockyard side: reusing" in proc.stdout and "the trl side: resuming from" in proc.stdout, tail
  last = proc.stdout.strip().splitlines()[-1]
  assert RESULT.match(last), f"last line is not the RESULT line: {last!r}\n{tail}"

  report = json.loads(report_path.read_text())
  steps = report["settings"]["steps"]
  dy, trl = report["dockyard"], report["trl"]
  assert dy["steps"] == trl["steps"] == steps
  # the same prompts, step by step: dockyard's sampler order as TRL's reward function saw it
  assert len(trl["prompts"]) == steps
  assert trl["prompts"] == trl["expected_prompts"]
  assert all(len(p) == report["settings"]["prompts"] for p in trl["prompts"])
  for side in (dy, trl):
    assert len(side["step_s"]) == steps and all(t > 0 for t in side["step_s"])
  assert trl["first_of_process"] == [0, 1]          # step 2 ran in the resumed process
  assert len(trl["reward"]) == steps                # the log history came back with the checkpoint
  assert math.isfinite(report["speed_vs_trl"]) and report["speed_vs_trl"] > 0
  assert float(last.split()[2]) == pytest.approx(report["speed_vs_trl"], abs=1e-3)


@pytest.mark.slow
def test_peer_trl_check_step_agrees(tmp_path):
  """`--check_step`: one optimizer step of each side on TRL's own batch. On the tiny model both
  trainers' weight changes (the gradient, Adam made linear) must agree to float32 noise, the
  prompts must tokenize the same and the rewards shape the same; the last line is RESULT."""
  report_path = tmp_path / "step.json"
  cmd = [sys.executable, "bench/peer_trl.py", "--smoke", "--check_step", f"--workdir={tmp_path / 'w'}",
         f"--report={report_path}"]
  proc = subprocess.run(cmd, cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=600)
  tail = f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
  assert proc.returncode == 0, tail
  last = proc.stdout.strip().splitlines()[-1]
  assert re.match(r"^RESULT step_rel_diff [0-9.]+e[-+][0-9]+ x$", last), tail
  r = json.loads(report_path.read_text())["step_check"]
  assert r["tensors"] > 0 and r["completion_tokens"] > 0
  assert r["prompt_mismatch"] == 0 and r["shaped_reward_max_diff"] < 1e-6
  assert r["is_weight_mean"] == pytest.approx(1.0, abs=1e-6)
  # a batch with no signal would agree trivially: at least one group must carry an advantage
  assert r["flat_groups"] < r["groups"], tail
  assert r["rel_diff"] < 1e-4 and r["cosine"] > 0.9999, tail
  assert r["grad_norm_dockyard"] == pytest.approx(r["grad_norm_trl"], rel=1e-4)
  assert float(last.split()[2]) == pytest.approx(r["rel_diff"], rel=1e-3)

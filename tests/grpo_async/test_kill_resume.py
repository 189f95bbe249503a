"""A run SIGKILLed mid-step (a real subprocess) and resumed loses no prompt and trains on none twice.

The killed-and-resumed history (per step: the prompt seqs and ids trained on, the last record of
each step winning, since steps after the last checkpoint are redone) must equal the history of
an uninterrupted run. `consume_in_order=True` makes that history independent of which
generation finished first; the age-bounded buffer, the pending prompts, the sampler position and the
weight version all come back from the checkpoint.
"""
import json
import os
import signal
import subprocess
import sys
import time

import run_async_fake
from dockyard.grpo.async_source import ASYNC_LOG

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS, P, DELAY = 12, 2, 0.05


def read_log(workdir):
  path = os.path.join(workdir, ASYNC_LOG)
  if not os.path.exists(path):
    return []
  rows = []
  for line in open(path).read().splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:   # a line cut by the kill
      pass
  return rows


def steps(rows):
  return [r for r in rows if "step" in r]


def start(tokenizer_dir, workdir):
  return launch("run_async_fake.py", tokenizer_dir, workdir, STEPS, DELAY)


def launch(script, *args):
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
  return subprocess.Popen([sys.executable, os.path.join(HERE, script), *map(str, args)], env=env, cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def kill_after(proc, workdir, rows_seen, wait_s=120):
  """SIGKILLs `proc` as soon as it has logged `rows_seen` step records (so: in the next step)."""
  deadline = time.monotonic() + wait_s
  while len(steps(read_log(workdir))) < rows_seen:
    assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stderr.read()[-3000:]}"
    assert time.monotonic() < deadline, f"no progress within {wait_s} s"
    time.sleep(0.005)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait(30) == -signal.SIGKILL


def history(rows):
  by_step = {}
  for r in steps(rows):   # file order: a resumed run's record of a step replaces the killed run's
    by_step[r["step"]] = (r["seqs"], r["instance_ids"])
  return [by_step[s] for s in sorted(by_step)]


def test_sigkill_mid_step_then_resume_matches_an_uninterrupted_run(tokenizer_dir, tmp_path):
  clean = str(tmp_path / "clean")
  run_async_fake.main(tokenizer_dir, clean, STEPS, DELAY)
  want = history(read_log(clean))
  assert len(want) == STEPS
  assert sorted(s for seqs, _ in want for s in seqs) == list(range(STEPS * P))

  work = str(tmp_path / "killed")
  kill_after(start(tokenizer_dir, work), work, 3)
  first = steps(read_log(work))
  kill_after(start(tokenizer_dir, work), work, len(first) + 3)
  second = steps(read_log(work))
  last = start(tokenizer_dir, work)
  assert last.wait(180) == 0, last.stderr.read()[-3000:]
  rows = read_log(work)
  # each run resumed from a checkpoint at (or just before, when killed while saving) the last
  # step the previous one logged, with prompts still pending from the killed run to redo
  starts = [r for r in rows if "start" in r]
  assert [r["start"] for r in starts][0] == 0 and len(starts) == 3
  assert first[-1]["step"] - 1 <= starts[1]["start"] <= first[-1]["step"]
  assert second[-1]["step"] - 1 <= starts[2]["start"] <= second[-1]["step"]
  assert starts[1]["next_seq"] > starts[1]["start"] * P    # it had run ahead of the trainer
  got = history(rows)
  assert got == want
  trained = [s for seqs, _ in got for s in seqs]
  assert len(trained) == len(set(trained)) == STEPS * P    # none twice, none lost
  state = json.load(open(os.path.join(work, "checkpoints", "latest", "loop_state.json")))
  assert state["step"] == STEPS and state["buffer"]["version"] == STEPS


def test_sigkill_on_the_real_stack_then_resume_matches(real_parts, tmp_path):
  """The same, with the JAX trainer (orbax checkpoints), CPU vLLM and the WeightSynchronizer."""
  import run_async_real
  steps = 4
  clean = str(tmp_path / "clean")
  run_async_real.main(clean, steps, parts=real_parts[1:])
  want = history(read_log(clean))
  assert len(want) == steps

  work = str(tmp_path / "killed")
  kill_after(launch("run_async_real.py", work, steps), work, 2, wait_s=300)
  logged = len(steps_of(work))
  last = launch("run_async_real.py", work, steps)
  assert last.wait(300) == 0, last.stderr.read()[-3000:]
  rows = read_log(work)
  starts = [r["start"] for r in rows if "start" in r]
  assert len(starts) == 2 and logged - 1 <= starts[1] <= logged   # resumed from the last checkpoint
  got = history(rows)
  assert got == want
  trained = [s for seqs, _ in got for s in seqs]
  assert len(trained) == len(set(trained)) == steps * P


def steps_of(workdir):
  return steps(read_log(workdir))

"""Evaluation end to end on the tiny local model: `python -m dockyard.launch --config=configs/eval.py:set=math`
(local Ray, CPU vLLM; no trainer) on a few held-out sums reports greedy pass@1 and sampled pass@k
with their intervals, and every number in eval.json and eval_table.md is recomputed here from the
completions it wrote (eval_samples.jsonl).

The untrained tiny model is rarely right, so the counts here may all be zero; the accounting with
mixed counts is checked on the fakes (tests/grpo/test_eval_passk_fakes.py). This test is the
plumbing: the CLI, the real engine's greedy and sampled requests, the files, the printed lines.
"""
import collections
import json
import os
import subprocess
import sys

import pytest

from dockyard import estimators

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N_TASKS, N_SAMPLES, K = 8, 12, 4


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("math_eval"))
  cmd = [sys.executable, "-m", "dockyard.launch", "--config=configs/eval.py:set=math",
         f"--workdir={workdir}",
         "--config.env.math.max_operand=2", "--config.env.math.num_train=1",
         f"--config.env.math.num_validation={N_TASKS}", f"--config.eval.pass_k={K}",
         f"--config.eval.num_samples={N_SAMPLES}", "--config.logging.tensorboard=False"]
  env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, f"eval failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
  report = json.load(open(os.path.join(workdir, "eval.json")))
  samples = [json.loads(line) for line in open(os.path.join(workdir, "eval_samples.jsonl"))]
  table = open(os.path.join(workdir, "eval_table.md")).read()
  return report, samples, proc.stdout + "\n" + table


def test_greedy_pass_at_1_and_its_wilson_interval(eval_run):
  report, samples, stdout = eval_run
  greedy = [s for s in samples if s["kind"] == "val_T0"]
  assert len(greedy) == N_TASKS == report["n"] and len({s["instance_id"] for s in greedy}) == N_TASKS
  wins = sum(s["success"] for s in greedy)
  assert report["pass@1"] == pytest.approx(wins / N_TASKS) == pytest.approx(report["val/accuracy"])
  assert report["pass@1_ci95"] == pytest.approx(list(estimators.wilson_interval(wins, N_TASKS)))
  assert report["pass@1_temperature"] == 0.0
  assert "eval: pass@1 (T=0)" in stdout and f"eval: pass@{K} (n={N_SAMPLES}, T=1)" in stdout


def test_sampled_pass_at_k_is_the_unbiased_estimate_of_the_written_samples(eval_run):
  report, samples, _ = eval_run
  sampled = [s for s in samples if s["kind"] == "sample_T1"]
  assert len(sampled) == N_TASKS * N_SAMPLES
  wins = collections.Counter()
  for s in sampled:
    wins[s["instance_id"]] += s["success"]
    assert s["success"] == (s["reward"] == 1.0)
  assert report["sampled"]["completion_len_mean"] > 0
  counts = [(N_SAMPLES, wins[i]) for i in sorted({s["instance_id"] for s in sampled})]
  got = report["sampled"]
  for k in (1, K):
    per_task = estimators.pass_at_k_per_problem(counts, k)
    assert got[f"pass@{k}"] == pytest.approx(per_task.mean())
    lo, hi = got[f"pass@{k}_ci95"]
    assert lo <= got[f"pass@{k}"] <= hi and (lo, hi) == pytest.approx(estimators.bootstrap_ci(per_task, 1000, 0))
  assert got["pass@1"] <= got[f"pass@{K}"]
  assert got["tasks_with_a_success"] == sum(c > 0 for _, c in counts)


def test_the_table_holds_the_reported_numbers(eval_run):
  report, _, stdout = eval_run
  table = stdout.rsplit("\n| set |", 1)[1].strip().splitlines()
  rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]   # after the header and |---|
  assert [r[2] for r in rows] == ["pass@1", "pass@1", f"pass@{K}"]
  assert all(r[0] == "eval_math" and r[1] == str(N_TASKS) for r in rows)
  values = [report["pass@1"], report["sampled"]["pass@1"], report["sampled"][f"pass@{K}"]]
  cis = [report["pass@1_ci95"], report["sampled"]["pass@1_ci95"], report["sampled"][f"pass@{K}_ci95"]]
  for row, value, (lo, hi) in zip(rows, values, cis):
    assert row[4] == f"{value:.3f}" and row[5] == f"[{lo:.3f}, {hi:.3f}]"
  assert stdout.count("| eval_math |") == 6                     # printed, and written to eval_table.md

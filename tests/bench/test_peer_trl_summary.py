"""bench/peer_trl.py's bookkeeping without running a side: the seeds summary and the kept results.

The learning comparison is one ~1.5 h run per seed on this machine, so a seed's sides are kept in
`--workdir` and reused, and the claim is the summary over seeds (`--summarize`). Both are checked
here on hand-made reports; the sides themselves run in test_peer_trl_smoke.py.
"""
from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench", "peer_trl.py")


def load_bench():
  spec = importlib.util.spec_from_file_location("peer_trl_bench", BENCH)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def report(seed, start, dy_end, trl_end, speed, **settings):
  return dict(size="full", settings=dict(dict(steps=20, lr=4e-5), seed=seed, **settings),
              val_start=start, dockyard_val_end=dy_end, trl_val_end=trl_end,
              learn_vs_trl=(dy_end - start) / (trl_end - start), speed_vs_trl=speed)


def run_summarize(tmp_path, reports):
  paths = []
  for i, r in enumerate(reports):
    path = tmp_path / f"r{i}.json"
    path.write_text(json.dumps(r))
    paths.append(str(path))
  return subprocess.run([sys.executable, BENCH, "--summarize", *paths], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)


def test_summarize_is_the_ratio_of_mean_gains(tmp_path):
  reports = [report(0, 0.10, 0.30, 0.20, 4.0), report(1, 0.10, 0.20, 0.25, 5.0),
             report(2, 0.10, 0.40, 0.15, 6.0)]
  proc = run_summarize(tmp_path, reports)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.strip().splitlines()
  dy_gain, trl_gain = [0.20, 0.10, 0.30], [0.10, 0.15, 0.05]
  # the mean of the gains' ratio (1.667) is not the claim; the ratio of the mean gains (2.0) is
  assert lines[-2] == f"RESULT learn_vs_trl {statistics.mean(dy_gain) / statistics.mean(trl_gain):.3f} x"
  assert lines[-2] == "RESULT learn_vs_trl 2.000 x"
  assert lines[-1] == "RESULT speed_vs_trl 5.000 x"
  assert f"gain dockyard 0.200 +- {statistics.stdev(dy_gain):.3f}" in proc.stdout
  assert f"trl 0.100 +- {statistics.stdev(trl_gain):.3f}" in proc.stdout


@pytest.mark.parametrize("bad, message", [
    ([report(0, 0.1, 0.3, 0.2, 4.0), report(0, 0.1, 0.3, 0.2, 4.0)], "a seed appears twice"),
    ([report(0, 0.1, 0.3, 0.2, 4.0), report(1, 0.1, 0.3, 0.2, 4.0, temperature=1.0)],
     "differ in more than the seed"),
    ([dict(size="quick", settings=dict(seed=0), speed_vs_trl=3.0)], "takes learning reports"),
])
def test_summarize_refuses_reports_that_do_not_compare(tmp_path, bad, message):
  proc = run_summarize(tmp_path, bad)
  assert proc.returncode != 0
  assert message in proc.stderr
  assert "RESULT" not in proc.stdout


def test_a_kept_side_is_reused_not_rerun(tmp_path):
  bench = load_bench()
  kept = dict(steps=2, step_s=[1.0, 2.0], process_s=3.0, load=[0.1, 0.2])
  (tmp_path / "dockyard.json").write_text(json.dumps(kept))
  # A child process would fail on this spec path (it does not exist): reuse must not start one.
  assert bench.run_child("dockyard", str(tmp_path / "missing_spec.json"), str(tmp_path)) == kept

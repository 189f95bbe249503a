"""`python -m dockyard.seeds`: mean ± sd over runs, read from the loops' own metrics.jsonl."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from dockyard import seeds


def _run(tmp_path, name, vals, rewards):
  d = tmp_path / name
  d.mkdir()
  with open(d / "metrics.jsonl", "w") as f:
    f.write(json.dumps({"step": 0, "val/pass@1": vals[0], "val/pass@1_ci95_lo": vals[0] - 0.05,
                        "val/pass@1_ci95_hi": vals[0] + 0.05}) + "\n")
    for step, r in enumerate(rewards, 1):
      row = {"step": step, "reward/raw_mean": r, "time/step": 2.0}
      if step % 5 == 0:
        v = vals[step // 5]
        row.update({"val/pass@1": v, "val/pass@1_ci95_lo": v - 0.05, "val/pass@1_ci95_hi": v + 0.05})
      f.write(json.dumps(row) + "\n")
  return str(d)


def test_mean_sd_over_seeds_and_the_png(tmp_path):
  a = _run(tmp_path, "s0", [0.10, 0.30, 0.25], [0.1] * 10)
  b = _run(tmp_path, "s1", [0.12, 0.20, 0.40], [0.2] * 10)
  c = _run(tmp_path, "s2", [0.11, 0.15, 0.35], [0.3] * 10)
  s = seeds.summarize([a, b, c], "val/pass@1")
  assert s["n"] == 3
  np.testing.assert_allclose(s["start"], [0.11, np.std([0.10, 0.12, 0.11], ddof=1)])
  np.testing.assert_allclose(s["end"], [np.mean([0.25, 0.40, 0.35]), np.std([0.25, 0.40, 0.35], ddof=1)])
  np.testing.assert_allclose(s["best"][0], np.mean([0.30, 0.40, 0.35]))
  np.testing.assert_allclose(s["gain"][0], np.mean([0.15, 0.28, 0.24]))
  assert [r["end"][0] for r in s["runs"]] == [10, 10, 10] and s["runs"][0]["wall_s"] == 20.0
  assert "0.333 ± 0.076" in seeds.render(s)
  png = seeds.plot([a, b, c], "val/pass@1", str(tmp_path / "c.png"))
  assert os.path.getsize(png) > 10_000


def test_one_run_has_no_sd_and_bad_dirs_are_named(tmp_path):
  a = _run(tmp_path, "s0", [0.1, 0.2, 0.3], [0.0] * 10)
  s = seeds.summarize([a], "val/pass@1")
  assert s["end"][0] == pytest.approx(0.3) and np.isnan(s["end"][1])
  with pytest.raises(ValueError, match="no 'val/accuracy'"):
    seeds.summarize([a], "val/accuracy")
  with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
    seeds.summarize([str(tmp_path)], "val/pass@1")


def test_a_resumed_run_counts_each_step_once_and_all_the_time(tmp_path):
  a = _run(tmp_path, "s0", [0.1, 0.2, 0.3], [0.0] * 10)
  with open(os.path.join(a, "metrics.jsonl"), "a") as f:   # resumed from step 5: 6..10 again
    for step in range(6, 11):
      row = {"step": step, "reward/raw_mean": 0.0, "time/step": 2.0}
      if step == 10:
        row["val/pass@1"] = 0.35
      f.write(json.dumps(row) + "\n")
  r = seeds.run_summary(a, "val/pass@1")
  assert r["end"] == (10, 0.35) and r["redone_steps"] == 5 and r["wall_s"] == 30.0 and r["steps"] == 10


def test_cli(tmp_path):
  a = _run(tmp_path, "s0", [0.1, 0.2, 0.3], [0.0] * 10)
  b = _run(tmp_path, "s1", [0.1, 0.2, 0.5], [0.0] * 10)
  out = subprocess.run([sys.executable, "-m", "dockyard.seeds", f"--json={tmp_path / 's.json'}", a, b],
                       capture_output=True, text=True, timeout=120, check=True).stdout
  assert "over 2 run(s)" in out and "end 0.400 ± 0.141" in out
  assert json.load(open(tmp_path / "s.json"))["n"] == 2

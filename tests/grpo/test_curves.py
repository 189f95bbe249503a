"""curves.png: the panels that carry information under the config, drawn from metrics.jsonl."""
import json

import pytest

from configs import math as math_cfg
from dockyard import workdir
from dockyard.grpo import harness


def keys(config):
  return [p.key for p in harness.curve_panels(config)]


def test_panels_follow_the_config():
  config = math_cfg.get_config()          # tiny: one minibatch, a KL penalty
  assert config.grpo.num_minibatches == 1 and config.loss_fn.reference_policy_kl_penalty != 0
  assert keys(config) == ["reward/raw_mean", "val/pass@1", "groups/zero_variance_fraction", "train/kl",
                     "rollout/entropy_approx", "rollout/completion_len_mean"]
  panels = {p.key: p for p in harness.curve_panels(config)}
  assert panels["reward/raw_mean"].smooth > 1 and panels["val/pass@1"].band
  assert panels["val/pass@1"].also == (config.checkpoint.metric,) == ("val/accuracy",)
  config.unlock()
  config.grpo.num_minibatches = 2
  config.loss_fn.reference_policy_kl_penalty = 0.0
  assert "train/clip_fraction" in keys(config) and "train/kl" not in keys(config)


def test_trailing_mean():
  assert workdir.trailing_mean([1, 2, 3, 4], 2) == [1.0, 1.5, 2.5, 3.5]
  assert workdir.trailing_mean([1, 3], 10) == [1.0, 2.0]
  with pytest.raises(ValueError, match="k must be >= 1"):
    workdir.trailing_mean([1], 0)


def test_by_step_keeps_the_last_value_of_a_redone_step():
  rows = [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}, {"step": 2, "a": 5.0, "b": 1.0}]
  assert workdir.by_step(rows) == {1: {"step": 1, "a": 1.0}, 2: {"step": 2, "a": 5.0, "b": 1.0}}


def test_plot_draws_the_panels_with_data(tmp_path):
  config = math_cfg.get_config()
  metric = "val/pass@1"
  path = tmp_path / "metrics.jsonl"
  with open(path, "w") as f:
    for s in range(1, 13):
      row = {"step": s, "reward/raw_mean": s / 12, "train/kl": 0.01 * s, "rollout/completion_len_mean": 4.0,
             "train/clip_fraction": 0.0}
      if s % 4 == 0:
        row.update({metric: s / 20, f"{metric}_ci95_lo": s / 40, f"{metric}_ci95_hi": s / 15,
                    "val/accuracy": s / 20, "val/completion_len_mean": 5.0})
      f.write(json.dumps(row) + "\n")
  drawn = workdir.plot_curves(str(path), str(tmp_path / "curves.png"), harness.curve_panels(config))
  assert [p.key for p in drawn] == ["reward/raw_mean", metric, "train/kl", "rollout/completion_len_mean"]
  assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_the_live_line_shows_the_kl_only_with_a_penalty_and_no_clip_fraction():
  m = {"reward/raw_mean": 0.5, "train/kl": 0.0123, "train/clip_fraction": 0.0}
  assert "kl 0.0123" in harness._live_line(3, m, kl=True)
  assert "kl" not in harness._live_line(3, m) and "clip" not in harness._live_line(3, m, kl=True)

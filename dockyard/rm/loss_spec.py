"""The reward model's Bradley-Terry loss, written once in NumPy as the spec both trainers follow.

This file is the definition; `dockyard.trainer_jax.reward_loss` and
`dockyard.trainer_torch.reward_loss` must agree with it on any input. NumPy only.

Batch layout (as `dockyard.dpo.loss_spec`): rows are interleaved, row 2i the CHOSEN completion of
pair i and row 2i+1 the REJECTED one. The reward model gives one scalar per row, `rewards` [B]
(the score head read at each row's last real token, `dockyard.rm.model`).

Per pair, with r_w, r_l the chosen and rejected rewards, m the pair's margin (extras["margin"]
[B / 2], 0 when absent) and sigma the logistic function:
  l = -log sigma(r_w - r_l - m)
  Bradley-Terry (Ouyang et al. 2022, eq. 1); the margin as in Llama 2 (Touvron et al. 2023,
  eq. 2) and TRL's RewardTrainer (a per-pair "margin" column subtracted inside the sigmoid): a
  pair marked as a clearer preference must be won by more.

Aggregation: loss = sum of l / N_pairs, N_pairs = extras["total_pairs"] when given (so batches'
losses and metrics add up to a whole set's), else B / 2. Metrics, summed the same way:
  rewards_chosen, rewards_rejected, reward_margin   mean r_w, r_l, r_w - r_l
  accuracy          the fraction of pairs with r_w > r_l (a tie counts as lost)
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

METRICS = ("loss", "rewards_chosen", "rewards_rejected", "reward_margin", "accuracy")


def check_inputs(rewards_shape, extras: Mapping[str, Any]) -> None:
  """Names what is wrong (odd batch, a margin of the wrong length) instead of failing in a trace."""
  if len(rewards_shape) != 1 or rewards_shape[0] % 2 or rewards_shape[0] == 0:
    raise ValueError(f"reward loss: rewards must be [B] with B even and > 0 (rows 2i, 2i+1 are the "
                     f"chosen and rejected completions of pair i), got shape {tuple(rewards_shape)}")
  if "margin" in extras and tuple(np.shape(extras["margin"])) != (rewards_shape[0] // 2,):
    raise ValueError(f"reward loss: extras['margin'] must be [B / 2] = [{rewards_shape[0] // 2}] "
                     f"(one per pair), got shape {tuple(np.shape(extras['margin']))}")


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
  return -np.logaddexp(0.0, -x)


def reward_loss(rewards: np.ndarray, extras: Mapping[str, Any]) -> tuple[float, dict[str, float]]:
  """The reference loss: (scalar loss, summable metrics). See the module docstring."""
  check_inputs(np.shape(rewards), extras)
  r = np.asarray(rewards, np.float64)
  r_w, r_l = r[0::2], r[1::2]
  margin = np.asarray(extras.get("margin", np.zeros_like(r_w)), np.float64)
  total = float(extras["total_pairs"]) if "total_pairs" in extras else float(r_w.shape[0])
  total = max(total, 1.0)

  def mean(x):
    return float(np.sum(x) / total)

  loss = mean(-_log_sigmoid(r_w - r_l - margin))
  return loss, dict(loss=loss, rewards_chosen=mean(r_w), rewards_rejected=mean(r_l),
                    reward_margin=mean(r_w - r_l), accuracy=mean((r_w > r_l).astype(np.float64)))


def random_rewards(rng: np.random.Generator, pairs: int = 5, margin: bool = True):
  """Random inputs for checking an implementation against this spec: (rewards [2P], extras), with
  a per-pair margin (some pairs 0) when `margin`."""
  rewards = rng.normal(scale=2.0, size=2 * pairs).astype(np.float32)
  extras = {}
  if margin:
    extras["margin"] = np.where(rng.random(pairs) < 0.3, 0.0, rng.uniform(0.0, 3.0, pairs)).astype(np.float32)
  return rewards, extras

"""On-policy distillation: the GRPO loop's own samples, scored token by token by frozen teachers.

`grpo.objective='distill'` (configs/distill.py) keeps the one GRPO loop (the student samples
completions of the environment's prompts with the vLLM engines; the environment still scores them,
for the reward curves and validation) and takes this update on each step's groups:

  per token t of a sampled completion x (at the sampling temperature T, as every update here):
    d_t = log p_student(x_t | x_<t) - sum_i w_i log p_teacher_i(x_t | x_<t)
  d_t is the sampled-token estimate of the per-token reverse KL(student || teacher mixture);
  the advantage of token t is A_t = mean(d) - d_t over the batch's tokens (-d_t with a constant
  baseline; + reward_weight x the group advantage of the env reward), and the loop's clipped
  policy-gradient loss (loss_fn.*) trains on these per-token advantages.
  With one optimizer step a batch the ratio is 1 and the gradient is E[sum_t A_t grad log p(x_t)]:
  each token is pushed toward what the teachers would have given it, and only by its own term
  (no credit to earlier tokens: the "advantage-style" per-token reverse KL of on-policy
  distillation, e.g. Agarwal et al. 2024 GKD with lambda=1 and Thinking Machines' 2025 recipe).

Several teachers combine by weighted sum of their logprobs (`weights`, summing to 1): the target is
the normalized geometric mixture, and the summed d_t is the weighted sum of each teacher's reverse
KL estimate. Teachers must share the student's tokenizer (the same vocabulary): a teacher with
another tokenizer is refused by name. Not done: the top-k logit KL (it needs each position's top-k
logprobs through the `Policy` seam, which hands losses the sampled tokens' logprobs only), teachers
chosen per prompt, and cross-tokenizer alignment.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dockyard.grpo.step import Update, train_on_groups
from dockyard.policy import Policy, TrainBatch


def token_advantages(batch: TrainBatch, teachers: Sequence[Policy], weights: Sequence[float],
                     reward_weight: float) -> tuple[np.ndarray, dict[str, float]]:
  """(advantages [B, T], metrics) for a batch holding the student's `prev_logprobs` and the
  groups' sequence `advantages` [B]."""
  m = batch.loss_mask
  student = np.asarray(batch.extras["prev_logprobs"], np.float64)
  target = sum(float(w) * np.asarray(t.logprobs(batch), np.float64) for t, w in zip(teachers, weights)) * m
  gap = (student - target) * m   # d_t: the per-token reverse-KL estimate
  n = max(float(m.sum()), 1.0)
  kl = float(gap.sum() / n)
  # -d_t less its batch mean: a constant baseline (E[grad log p] = 0, so the gradient stays
  # unbiased), without which every token's advantage has the sign of -KL and an optimizer that
  # normalizes per coordinate (Adam) also moves the logits of tokens nobody sampled.
  adv = (kl - gap) * m + float(reward_weight) * np.asarray(batch.extras["advantages"], np.float64)[:, None] * m
  return adv.astype(np.float32), {"distill/reverse_kl": kl, "distill/teacher_logprob_mean": float(target.sum() / n)}


def distill_update(teachers: Sequence[Policy], weights: Sequence[float], reward_weight: float) -> Update:
  """The GRPO loop's `Update` for on-policy distillation from `teachers` (frozen `Policy`s, only
  their `logprobs` is called) mixed by `weights`."""
  if len(teachers) != len(weights) or not teachers:
    raise ValueError(f"{len(teachers)} teachers for {len(weights)} weights")

  def fn(policy: Policy, groups, settings, reference: Policy | None) -> dict[str, float]:
    return train_on_groups(
        policy, groups, settings.update_loss, pad_id=settings.pad_id, kl_coef=settings.kl_coef,
        reference=reference, num_minibatches=settings.num_minibatches,
        temperature=settings.sampling.temperature,
        advantage_fn=lambda batch: token_advantages(batch, teachers, weights, reward_weight))
  return Update(fn, name="distill")

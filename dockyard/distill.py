"""On-policy distillation: the GRPO loop's own samples, scored by frozen teachers.

`grpo.objective='distill'` (configs/distill.py) keeps the one GRPO loop (the student samples
completions of the environment's prompts with the vLLM engines; the environment still scores them,
for the reward curves and validation) and takes this update on each step's groups, with one of
two losses (`grpo.distill.loss`):

- 'topk_kl' (default): every teacher gives its top k tokens per position of the student's samples
  and their logprobs (`Policy.topk_logprobs`, at the sampling temperature T); the trainer hands the
  loss the student's logprobs of the same ids (the top-k contract of `dockyard.policy`), and the
  loss is, per token, the reverse KL(student || teacher) between the two distributions coarsened to
  the teacher's k tokens plus one bucket for everything else (`topk_kl_loss`, the NumPy spec),
  summed over teachers with their `weights`, a token mean over the batch. A dense signal: every
  position moves toward the teacher's whole top k, not only the sampled token. The bucket keeps it a
  proper KL without renormalizing either side over the k (a lower bound of the full reverse KL;
  NeMo-RL's top-k distillation and GKD are the peers read first). `reward_weight` > 0 adds that
  multiple of the loop's clipped policy-gradient loss on the env reward's group advantages.
- 'sampled_token': the per-token estimate on the sampled tokens alone,
    d_t = log p_student(x_t | x_<t) - sum_i w_i log p_teacher_i(x_t | x_<t),
  each token's advantage A_t = mean(d) - d_t over the batch's tokens (+ reward_weight x the group
  advantage of the env reward), trained with the loop's clipped policy-gradient loss. With one
  optimizer step a batch its gradient is E[sum_t A_t grad log p(x_t)]: the "advantage-style"
  per-token reverse KL (Agarwal et al. 2024 GKD with lambda=1; Thinking Machines' 2025 recipe).
  Several teachers: the weighted sum of their logprobs (the normalized geometric mixture).

Teachers must share the student's tokenizer (the same vocabulary): a teacher with another
tokenizer is refused by name. Not done: teachers chosen per prompt, cross-tokenizer alignment.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dockyard.grpo.step import Update, train_on_groups
from dockyard.policy import Policy, TrainBatch

# The top-k KL's floor for the "rest" bucket's mass (1 - the top-k mass): keeps its log finite
# where the top k hold (nearly) everything, in float32.
REST_FLOOR = 1e-6


def topk_kl_loss(topk_logprobs, loss_mask, extras, weights: Sequence[float]):
  """The top-k KL, in NumPy: the spec `dockyard.trainer_jax.loss.topk_kl_loss` and
  `dockyard.trainer_torch.loss.topk_kl_loss` follow (tests/trainer_torch/test_topk_distill.py).

  extras: `teacher_topk_logprobs` [B, T, M*K] (teacher i's top-k at [..., i*K:(i+1)*K]), the
  whole batch's `total_tokens` (the micro-batching contract), and `topk_logprobs` [B, T, M*K]:
  the student's logprobs of the same ids (the trainer adds it; the only term with gradient).
  Per token and teacher, over the K tokens and a (K+1)-th bucket "everything else":
    KL_i = sum_j p_j (log p_j - log q_j) + p_rest (log p_rest - log q_rest)
  with p the student's, q the teacher's probabilities, p_rest = max(1 - sum_j p_j, REST_FLOOR):
  the reverse KL between the two distributions coarsened to the teacher's top k (exact on that
  partition, a lower bound of the full reverse KL). loss = sum_{b,t} m sum_i w_i KL_i / N_tok.
  Metrics: `topk_kl` (= loss), `topk_student_mass` (sum_j p_j, token mean, of teacher 0's top k)."""
  m = np.asarray(loss_mask, np.float64)
  student = np.asarray(topk_logprobs, np.float64)
  teacher = np.asarray(extras["teacher_topk_logprobs"], np.float64)
  n = max(float(extras.get("total_tokens", m.sum())), 1.0)
  k = student.shape[-1] // len(weights)
  per_token = np.zeros(m.shape)
  mass0 = None
  for i, w in enumerate(weights):
    s, q = student[..., i * k:(i + 1) * k], teacher[..., i * k:(i + 1) * k]
    ps, pq = np.exp(s), np.exp(q)
    rest_s = np.maximum(1.0 - ps.sum(-1), REST_FLOOR)
    rest_q = np.maximum(1.0 - pq.sum(-1), REST_FLOOR)
    kl = (ps * (s - q)).sum(-1) + rest_s * (np.log(rest_s) - np.log(rest_q))
    per_token += float(w) * kl
    mass0 = ps.sum(-1) if mass0 is None else mass0
  loss = float((per_token * m).sum() / n)
  return loss, {"topk_kl": loss, "topk_student_mass": float((mass0 * m).sum() / n)}


def token_advantages(batch: TrainBatch, student: Policy, teachers: Sequence[Policy],
                     weights: Sequence[float], reward_weight: float) -> tuple[dict, dict[str, float]]:
  """The sampled-token estimator's extras ({'advantages' [B, T], 'prev_logprobs' [B, T]}) and
  metrics, for a batch holding the groups' sequence `advantages` [B] (and `prev_logprobs`, the
  student before this update, where the step computed them; else scored here)."""
  m = batch.loss_mask
  prev = batch.extras.get("prev_logprobs")
  if prev is None:
    prev = np.asarray(student.logprobs(batch), np.float32) * m
  student_lp = np.asarray(prev, np.float64)
  target = sum(float(w) * np.asarray(t.logprobs(batch), np.float64) for t, w in zip(teachers, weights)) * m
  gap = (student_lp - target) * m   # d_t: the per-token reverse-KL estimate
  n = max(float(m.sum()), 1.0)
  kl = float(gap.sum() / n)
  # -d_t less its batch mean: a constant baseline (E[grad log p] = 0, so the gradient stays
  # unbiased), without which every token's advantage has the sign of -KL and an optimizer that
  # normalizes per coordinate (Adam) also moves the logits of tokens nobody sampled.
  adv = (kl - gap) * m + float(reward_weight) * np.asarray(batch.extras["advantages"], np.float64)[:, None] * m
  extras = {"advantages": adv.astype(np.float32), "prev_logprobs": np.asarray(prev, np.float32)}
  return extras, {"distill/reverse_kl": kl, "distill/teacher_logprob_mean": float(target.sum() / n)}


def teacher_topk(batch: TrainBatch, teachers: Sequence[Policy], k: int) -> tuple[dict, dict[str, float]]:
  """The top-k KL's extras: every teacher's top k per position, side by side ({'topk_ids',
  'teacher_topk_logprobs'} [B, T, M*K]), and the teachers' top-k mass (token mean, teacher 0)."""
  ids, lps = zip(*(t.topk_logprobs(batch, k) for t in teachers))
  m = batch.loss_mask
  mass = float((np.exp(lps[0]).sum(-1) * m).sum() / max(float(m.sum()), 1.0))
  return ({"topk_ids": np.concatenate(ids, -1).astype(np.int32),
           "teacher_topk_logprobs": np.concatenate(lps, -1).astype(np.float32)},
          {"distill/teacher_topk_mass": mass})


LOSSES = ("topk_kl", "sampled_token")


def distill_update(teachers: Sequence[Policy], weights: Sequence[float], reward_weight: float,
                   loss: str = "topk_kl", top_k: int = 16, topk_loss=None) -> Update:
  """The GRPO loop's `Update` for on-policy distillation from `teachers` (frozen `Policy`s: only
  their `logprobs` / `topk_logprobs` are called) mixed by `weights`. `loss`: 'topk_kl' trains on
  `topk_loss` (the backend's `topk_kl_loss`, closed over `weights`) against the teachers' `top_k`
  (+ `reward_weight` x the loop's policy-gradient loss on the env reward's group advantages);
  'sampled_token' on the loop's policy-gradient loss with the per-token advantages of
  `token_advantages`."""
  if len(teachers) != len(weights) or not teachers:
    raise ValueError(f"{len(teachers)} teachers for {len(weights)} weights")
  if loss not in LOSSES:
    raise ValueError(f"grpo.distill.loss: must be one of {LOSSES}, got {loss!r}")
  if loss == "topk_kl" and topk_loss is None:
    raise ValueError("loss='topk_kl' needs topk_loss (the backend's top-k KL loss)")

  def fn(policy: Policy, groups, settings, reference: Policy | None) -> dict[str, float]:
    common = dict(pad_id=settings.pad_id, kl_coef=settings.kl_coef, reference=reference,
                  num_minibatches=settings.num_minibatches, temperature=settings.sampling.temperature)
    if loss == "sampled_token":
      return train_on_groups(
          policy, groups, settings.update_loss, **common,
          extras_fn=lambda batch: token_advantages(batch, policy, teachers, weights, reward_weight))
    return train_on_groups(policy, groups, _with_reward(settings.update_loss), **common,
                           extras_fn=lambda batch: teacher_topk(batch, teachers, int(top_k)))

  made = {}

  def _with_reward(pg):
    """The top-k KL, + reward_weight x `pg` (the loop's loss on the groups' advantages) when that
    weight is > 0; made once per `pg`, since a JAX step compiles per loss callable."""
    if not reward_weight:
      return topk_loss
    if id(pg) not in made:
      def combined(logprobs, loss_mask, extras):
        kl, metrics = topk_loss(logprobs, loss_mask, extras)
        pg_loss, pg_metrics = pg(logprobs, loss_mask, extras)
        return kl + float(reward_weight) * pg_loss, {**pg_metrics, **metrics}
      made[id(pg)] = (pg, combined)
    return made[id(pg)][1]
  return Update(fn, name=f"distill_{loss}")

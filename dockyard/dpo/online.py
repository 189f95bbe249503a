"""Online DPO: the GRPO loop's sampled, scored groups -> best-vs-worst pairs -> one preference step.

`grpo.objective='dpo'` (configs/online_dpo.py) keeps everything of the one GRPO loop (the trajectory
source samples `grpo.num_generations_per_prompt` completions a prompt with the engines and the
environment scores them; refit, canary, validation, checkpoints as in GRPO) and replaces its
policy-gradient update with this one:

  pairs   from each group whose shaped rewards are not all equal: chosen = the completion with
          the highest shaped reward, rejected = the one with the lowest (the first of each on a
          tie). A flat group gives no pair (and dynamic sampling, when on, has dropped it already).
  batch   the pairs interleaved (`data.make_pair_batch`: row 2i chosen, 2i+1 rejected; the loss
          mask on the sampled completion tokens, as sampled: EOS where generation stopped on it,
          none where it was cut at max_new_tokens), at the sampling temperature (the policy and
          the reference both score softmax(logits / T), the distribution that drew the tokens, as
          the GRPO update does; TRL's OnlineDPOTrainer scales its logits the same way).
  step    the frozen reference's logprobs (modes dpo / ipo; the reference is the policy the run
          started from, after any SFT warm start: `harness.resolve_reference`), then one
          `policy.train_step` with the preference loss of `grpo.preference`
          (`loss_spec.PreferenceConfig`: DPO, cDPO, DPOP, R-DPO, IPO, SimPO, ORPO, + SFT blend).

This is "judge K candidates with the environment, train on best vs worst" (the reward-ranked
online DPO of e.g. Xu et al. 2023 / Guo et al. 2024's OAIF with a verifier as the judge). The
judge is whatever scores the run's environment; a trained reward model wrapping it
(`env.reward_model.path`, `dockyard.envs.reward_model`) has not been run with this update.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dockyard.dpo.data import EncodedPair, make_pair_batch
from dockyard.dpo.loss_spec import PreferenceConfig
from dockyard.grpo.step import Update
from dockyard.policy import LossFn, Policy

PAD_MULTIPLE = 16   # as the GRPO update: few distinct batch lengths, few compilations


def pairs_from_groups(groups: Sequence) -> tuple[list[EncodedPair], list[float]]:
  """(pairs, their shaped-reward gaps): one best-vs-worst pair per group with distinct shaped
  rewards (`Group.shaped`, set by `grpo.step.assign_advantages`)."""
  pairs, gaps = [], []
  for g in groups:
    shaped = np.asarray(g.shaped, np.float64)
    best, worst = int(np.argmax(shaped)), int(np.argmin(shaped))
    if shaped[best] == shaped[worst]:
      continue
    pairs.append(EncodedPair(list(g.prompt_ids), list(g.completions[best].token_ids),
                             list(g.completions[worst].token_ids)))
    gaps.append(float(shaped[best] - shaped[worst]))
  return pairs, gaps


def dpo_update(policy: Policy, groups: Sequence, loss_fn: LossFn, cfg: PreferenceConfig, *,
               pad_id: int, temperature: float, reference: Policy | None) -> dict[str, float]:
  """One preference step on the groups' best-vs-worst pairs; `train/*` metrics (`train/pairs` 0
  and no step when every group is flat)."""
  pairs, gaps = pairs_from_groups(groups)
  if not pairs:
    return {"train/pairs": 0.0, "train/skipped": 1.0}
  batch = make_pair_batch(pairs, pad_id, PAD_MULTIPLE)
  batch.temperature = float(temperature)
  if cfg.needs_reference:
    if reference is None:
      raise ValueError(f"grpo.preference.mode={cfg.mode!r} needs the reference policy")
    batch.extras["reference_logprobs"] = np.asarray(reference.logprobs(batch), np.float32)
  metrics = {f"train/{k}": float(v) for k, v in policy.train_step(batch, loss_fn).items()}
  metrics.update({"train/pairs": float(len(pairs)), "train/pair_reward_gap": float(np.mean(gaps)),
                  "train/sequences": float(batch.batch_size), "train/tokens": float(batch.loss_mask.sum())})
  return metrics


def online_dpo_update(cfg: PreferenceConfig) -> Update:
  """The GRPO loop's `Update` for online DPO with the loss options `cfg` (its loss, built from the
  same options for the policy's backend, comes in as `RunSettings.update_loss`)."""
  def fn(policy: Policy, groups: Sequence, settings, reference: Policy | None) -> dict[str, float]:
    return dpo_update(policy, groups, settings.update_loss, cfg, pad_id=settings.pad_id,
                      temperature=settings.sampling.temperature, reference=reference)
  return Update(fn, reads_reference=cfg.needs_reference, name=f"online {cfg.mode}")

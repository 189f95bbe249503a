"""Builds the configured `Policy` and its losses: the one place that chooses a trainer backend.

`config.policy.backend` is 'jax' (`dockyard.trainer_jax.policy.JaxPolicy`) or 'torch'
(`dockyard.trainer_torch.policy.TorchPolicy`). Each is imported only when chosen, so a JAX run
never imports torch's distributed stack and a torch run never imports JAX. A `LossFn` is written
in the backend's array type, so the runner takes the loop's losses from here too (`make_losses`)
and hands them to `grpo.loop.grpo_train` with the loop's update for `grpo.objective`
(`make_update`; and the preference loss to `dpo.loop.dpo_train`; the reward model and its loss
to `rm.loop.rm_train`): neither dockyard.grpo, dockyard.dpo nor dockyard.rm imports this module.
"""
from __future__ import annotations

from typing import Any

from dockyard.policy import LossFn, Policy

BACKENDS = ("jax", "torch")


def _backend(config: Any) -> str:
  backend = config.policy.backend
  if backend not in BACKENDS:
    raise ValueError(f"config.policy.backend: must be 'jax' or 'torch', got {backend!r}")
  return backend


def make_policy(config: Any, model_path: str) -> Policy:
  if _backend(config) == "jax":
    from dockyard.trainer_jax.policy import JaxPolicy
    return JaxPolicy.from_hf(model_path, config)
  from dockyard.trainer_torch.policy import TorchPolicy
  return TorchPolicy.from_hf(model_path, config)


def make_loss(config: Any, kind: str = "pg") -> LossFn:
  """'pg': the clipped-PG loss on `config.loss_fn` (+ rollout.max_new_tokens); 'nll': SFT."""
  from dockyard.grpo.loss_spec import LossConfig
  if kind not in ("pg", "nll"):
    raise ValueError(f"loss kind must be 'pg' or 'nll', got {kind!r}")
  losses = _losses_module(config)
  return losses.make_pg_loss(LossConfig.from_config(config)) if kind == "pg" else losses.nll_loss


def _losses_module(config: Any):
  if _backend(config) == "jax":
    from dockyard.trainer_jax import loss
  else:
    from dockyard.trainer_torch import loss
  return loss


def make_preference_loss(config: Any, section: Any = None) -> LossFn:
  """The DPO-family loss (`dpo.loss_spec.PreferenceConfig`) on `section` (default `config.dpo`), in
  the backend's array type."""
  from dockyard.dpo.loss_spec import PreferenceConfig
  if _backend(config) == "jax":
    from dockyard.trainer_jax.preference_loss import make_preference_loss
  else:
    from dockyard.trainer_torch.preference_loss import make_preference_loss
  return make_preference_loss(PreferenceConfig.from_config(config.dpo if section is None else section))


def make_reward_model(config: Any, model_path: str, trainable: bool = True):
  """The `rm.model.RewardModel` of `config.policy.backend` (configs/rm.py) on `model_path`;
  `trainable=False`: for scoring only (no optimizer state)."""
  if _backend(config) == "jax":
    from dockyard.trainer_jax.reward_model import JaxRewardModel
    return JaxRewardModel.from_hf(model_path, config, trainable)
  from dockyard.trainer_torch.reward_model import TorchRewardModel
  return TorchRewardModel.from_hf(model_path, config, trainable)


def make_reward_loss(config: Any):
  """The Bradley-Terry loss (`rm.loss_spec`) in the array type of `config.policy.backend`."""
  if _backend(config) == "jax":
    from dockyard.trainer_jax.reward_loss import reward_loss
  else:
    from dockyard.trainer_torch.reward_loss import reward_loss
  return reward_loss


def make_update(config: Any, tokenizer: Any = None):
  """The GRPO loop's update (`grpo.step.Update`) for `config.grpo.objective`: GRPO's policy-gradient
  step, online DPO's preference step on best-vs-worst pairs (`dockyard.dpo.online`), or on-policy
  distillation (`dockyard.distill`: its teachers are built here; one whose tokenizer differs from
  the student's `tokenizer` is wrapped in a `SpanAlignedTeacher`, sampled_token only)."""
  if config.grpo.objective == "distill":
    from dockyard.distill import SpanAlignedTeacher, distill_update
    from dockyard.models import packaged
    from dockyard.validate import ConfigError
    distill = config.grpo.distill
    teachers = []
    for spec in distill.teachers:
      path = packaged.resolve_path(spec)
      theirs = _other_tokenizer(path, tokenizer)
      if theirs is not None and distill.loss == "topk_kl":
        raise ConfigError("grpo.distill.loss", f"'topk_kl' compares next-token distributions token by "
                          f"token, which needs one vocabulary, and teacher {spec!r} has another tokenizer "
                          "than the student's: use loss='sampled_token' (aligned on text spans, "
                          "docs/distill.md) or a teacher that shares the student's tokenizer")
      teacher = make_policy(config, path)
      teachers.append(teacher if theirs is None else SpanAlignedTeacher(teacher, theirs, tokenizer))
    weights = tuple(distill.weights) or (1.0 / len(teachers),) * len(teachers)
    losses = _losses_module(config)
    return distill_update(teachers, weights, float(distill.reward_weight), loss=distill.loss,
                          top_k=int(distill.top_k), topk_loss=losses.make_topk_kl_loss(weights),
                          combine=distill.combine)
  if config.grpo.objective == "dpo":
    from dockyard.dpo.loss_spec import PreferenceConfig
    from dockyard.dpo.online import online_dpo_update
    return online_dpo_update(PreferenceConfig.from_config(config.grpo.preference))
  from dockyard.grpo.step import POLICY_GRADIENT
  return POLICY_GRADIENT


def _other_tokenizer(path: str, tokenizer: Any):
  """A distillation teacher's tokenizer where it differs from the student's (another vocabulary),
  else None: the teacher then scores the student's token ids as they are."""
  import transformers
  if tokenizer is None:
    raise ValueError("grpo.distill.teachers: the student's tokenizer is needed to check the teachers'")
  theirs = transformers.AutoTokenizer.from_pretrained(path)
  return None if theirs.get_vocab() == tokenizer.get_vocab() else theirs


def make_losses(config: Any) -> tuple[LossFn, LossFn]:
  """(the GRPO loop's update loss, SFT NLL loss) in the array type of `config.policy.backend`: the
  update loss is the clipped-PG loss, or under grpo.objective='dpo' the preference loss on
  `config.grpo.preference` (online DPO, `dockyard.dpo.online`)."""
  update = (make_preference_loss(config, config.grpo.preference) if config.grpo.objective == "dpo"
            else make_loss(config, "pg"))
  return update, make_loss(config, "nll")

"""Online DPO (`grpo.objective='dpo'`, configs/online_dpo.py): the GRPO loop's groups -> best-vs-worst
pairs -> a preference step. The pairing is checked on hand-made groups; the loop runs on the
fakes of `grpo_fakes.py` (a bigram policy and its sampler, a learnable reward), where the
preference step must raise the reward as the GRPO update does."""
import json
import os

import numpy as np
import pytest

from dockyard import policy_factory, validate
from dockyard.dpo.loss_spec import PreferenceConfig
from dockyard.dpo.online import dpo_update, pairs_from_groups
from dockyard.envs.math import MathConfig
from dockyard.grpo.batch import Group
from dockyard.rollout.base import Completion

from grpo_fakes import BigramPolicy, FirstDigitEnv, math_config, run_grpo
from test_grpo_loop import _parts
from tests.config_overrides import with_overrides


def _group(prompt, completions, shaped):
  return Group(task={"instance_id": "t"}, prompt_ids=prompt,
               completions=[Completion(prompt_ids=[], token_ids=c, logprobs=[-1.0] * len(c),
                                       finish_reason="stop", weight_version=0) for c in completions],
               shaped=np.asarray(shaped, np.float32))


def test_pairs_are_each_groups_best_and_worst_and_flat_groups_give_none():
  groups = [_group([1, 2], [[3], [4, 4], [5], [6]], [0.0, 1.0, -0.2, 1.0]),   # best: the first 1.0
            _group([7], [[8], [9]], [1.0, 1.0]),                             # flat: no pair
            _group([10], [[11, 12], [13]], [-0.2, 0.0])]
  pairs, gaps = pairs_from_groups(groups)
  assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [([1, 2], [4, 4], [5]), ([10], [13], [11, 12])]
  assert gaps == pytest.approx([1.2, 0.2])


def test_a_step_uses_the_reference_when_the_mode_reads_it(tokenizer):
  groups = [_group([1, 2], [[3, 4], [5]], [1.0, 0.0]), _group([6], [[7], [8, 9]], [0.0, 1.0])]
  config = math_config("configs/online_dpo.py")
  policy, reference = BigramPolicy(len(tokenizer), seed=0), BigramPolicy(len(tokenizer), seed=0)
  loss_fn, _ = policy_factory.make_losses(config)
  cfg = PreferenceConfig.from_config(config.grpo.preference)
  m = dpo_update(policy, groups, loss_fn, cfg, pad_id=0, temperature=1.0, reference=reference)
  assert m["train/pairs"] == 2 and m["train/sequences"] == 4 and m["train/tokens"] == 6
  # At the start the policy is its reference: every implicit reward is 0, the loss is log 2.
  assert m["train/preference_loss"] == pytest.approx(np.log(2), rel=1e-5)
  with pytest.raises(ValueError, match="reference"):
    dpo_update(policy, groups, loss_fn, cfg, pad_id=0, temperature=1.0, reference=None)
  flat = dpo_update(policy, [_group([1], [[2], [3]], [0.5, 0.5])], loss_fn, cfg,
                    pad_id=0, temperature=1.0, reference=reference)
  assert flat == {"train/pairs": 0.0, "train/skipped": 1.0} and policy.step == 1


@pytest.mark.parametrize("mode", ["dpo", "simpo"])
def test_the_loop_with_the_dpo_objective_raises_the_reward(tokenizer, tmp_path, mode):
  config = math_config(f"configs/online_dpo.py:mode={mode}", **{"grpo.max_num_steps": 16})
  env = FirstDigitEnv(MathConfig.from_config(config))
  policy, gen, sync = _parts(tokenizer)
  reference = BigramPolicy(len(tokenizer), seed=0) if mode == "dpo" else None   # simpo reads none
  workdir = str(tmp_path / "run")
  run_grpo(config, policy=policy, generator=gen, synchronizer=sync, env=env, tokenizer=tokenizer,
           train_tasks=env.train, val_tasks=env.validation, workdir=workdir, progress=False,
           reference=reference)
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  steps = [r for r in rows if "reward/raw_mean" in r]
  first, last = (np.mean([r["reward/raw_mean"] for r in part]) for part in (steps[:3], steps[-3:]))
  assert last > first + 0.3, (first, last)
  assert all(r["train/pairs"] >= 1 for r in steps if not r.get("train/skipped"))
  assert "train/preference_loss" in steps[-1] and "train/clip_fraction" not in steps[-1]
  assert gen.weight_version == policy.step


@pytest.mark.parametrize("override,key", [
    ({"grpo.objective": "ppo"}, "grpo.objective"),
    ({"grpo.objective": "policy_gradient"}, "grpo.preference"),
    ({"grpo.preference.mode": "kto"}, "grpo.preference.mode"),
    ({"grpo.preference.label_smoothing": 0.1, "grpo.preference.mode": "ipo"}, "grpo.preference.label_smoothing"),
    ({"loss_fn.reference_policy_kl_penalty": 0.05}, "loss_fn.reference_policy_kl_penalty"),
    ({"grpo.num_generations_per_prompt": 1}, "grpo.num_generations_per_prompt"),
    ({"optim.micro_batch_size": 7}, "optim.micro_batch_size"),
    ({"grpo.num_minibatches": 2}, "grpo.num_minibatches"),
])
def test_bad_online_dpo_settings_are_named(override, key):
  config = with_overrides("configs/online_dpo.py", override)
  with pytest.raises(validate.ConfigError, match=key.replace(".", r"\.")):
    validate.validate(config)


def test_a_policy_gradient_config_needs_no_preference_section():
  config = with_overrides("configs/math.py", {"grpo.objective": "dpo"})
  with pytest.raises(validate.ConfigError, match=r"grpo\.preference"):
    validate.validate(config)

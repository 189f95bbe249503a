"""The GRPO step pieces and the sync loop's wiring, driven through small fakes (`grpo_fakes.py`).

These check the code around the parts: batch layout, concurrent scoring, advantages and dynamic
sampling, prev-logprob recompute, refit order, validation, best-k and latest checkpoints, resume,
and that the loop's updates raise the reward on a learnable task. The real end-to-end test (JAX
trainer + CPU vLLM + the refit synchronizer + the math env) comes with the integration issue.
"""
import asyncio
import dataclasses
import json
import os

import numpy as np
import pytest

from dockyard import estimators, policy_factory, validate
from dockyard.envs.base import Reward
from dockyard.envs.math import MathConfig, MathEnv
from dockyard.grpo import checkpoints, harness, step
from dockyard.grpo.batch import Group, make_train_batch
from dockyard.grpo.loss_spec import LossConfig
from dockyard.grpo.sft import sft_warmup
from dockyard.rollout.base import Completion
from dockyard.trainer_jax import loss as jax_loss

from grpo_fakes import BigramGenerator, BigramPolicy, FakeSynchronizer, FirstDigitEnv, math_config, run_grpo


def comp(tokens, lps, reason="stop"):
  return Completion(prompt_ids=[], token_ids=tokens, logprobs=lps, finish_reason=reason, weight_version=0)


def test_make_train_batch_layout():
  g1 = Group(task={"instance_id": "a"}, prompt_ids=[5, 6, 7],
             completions=[comp([8, 9], [-0.1, -0.2]), comp([10], [-0.3])], advantages=np.array([1.0, -1.0]))
  g2 = Group(task={"instance_id": "b"}, prompt_ids=[4], completions=[comp([1, 2, 3, 4], [-1, -2, -3, -4.0]),
             comp([], [])], advantages=np.array([0.5, -0.5]))
  b = make_train_batch([g1, g2], pad_id=0, pad_multiple=8)
  assert b.input_ids.shape == (4, 8)
  np.testing.assert_array_equal(b.input_ids[0], [5, 6, 7, 8, 9, 0, 0, 0])
  np.testing.assert_array_equal(b.loss_mask[0], [0, 0, 0, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(b.attention_mask[2], [1, 1, 1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(b.loss_mask[3], 0)   # an empty completion trains nothing
  np.testing.assert_allclose(b.extras["generation_logprobs"][2, 1:5], [-1, -2, -3, -4])
  np.testing.assert_allclose(b.extras["generation_logprobs"][0], [0, 0, 0, -0.1, -0.2, 0, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(b.extras["advantages"], [1, -1, 0.5, -0.5])
  with pytest.raises(ValueError, match="logprobs"):
    make_train_batch([Group({"instance_id": "c"}, [1], [comp([2, 3], [-1.0])], advantages=np.ones(1))], 0)


def test_score_groups_runs_concurrently_up_to_the_limit():
  class SlowEnv(MathEnv):
    in_flight = peak = 0

    async def score(self, task, completion):
      SlowEnv.in_flight += 1
      SlowEnv.peak = max(SlowEnv.peak, SlowEnv.in_flight)
      await asyncio.sleep(0.05)
      SlowEnv.in_flight -= 1
      return Reward(float(completion == str(task["answer"])))

  env = SlowEnv(MathConfig(num_train=4, num_validation=0))
  groups = [Group(t, [1], [comp([], [])] * 4, texts=[str(t["answer"]), "x", "y", "z"]) for t in env.train]
  asyncio.run(step.score_groups(env, groups, max_in_flight=8))
  assert SlowEnv.peak == 8   # 8 scorings awaited at once, no more
  assert [[r.value for r in g.rewards] for g in groups] == [[1.0, 0.0, 0.0, 0.0]] * 4


def test_assign_advantages_drops_flat_groups_with_dynamic_sampling():
  def group(values, malformed=()):
    rs = [Reward(v, malformed=i in malformed) for i, v in enumerate(values)]
    return Group({"instance_id": "g"}, [1], [comp([1] * 3, [-1.0] * 3)] * len(values), rewards=rs)
  config = math_config(**{"grpo.dynamic_sampling": True, "grpo.reward_shaping.malformed_penalty": 0.5})
  groups = [group([1, 0, 0, 1]), group([0, 0, 0, 0]), group([0, 0, 0, 0], malformed=(0,))]
  kept, stats = step.assign_advantages(groups, config)
  # the third group is flat in raw reward but not after the malformed penalty: it is kept
  assert [id(g) for g in kept] == [id(groups[0]), id(groups[2])]
  assert stats["groups/zero_variance_fraction"] == pytest.approx(1 / 3)
  assert stats["reward/raw_mean"] == pytest.approx(2 / 12)
  assert stats["reward/shaped_mean"] == pytest.approx((2 - 0.5) / 12)
  np.testing.assert_allclose(groups[0].advantages, [2 / 3, -2 / 3, -2 / 3, 2 / 3], rtol=1e-6)
  np.testing.assert_allclose(groups[2].shaped, [-0.5, 0, 0, 0])


def _alternating_reward_groups(gen, env, tokenizer, config, sampling=None):
  """4 samples for each of env.train's prompts, rewarded 0, 1, 0, 1, with advantages set."""
  sampling = sampling or step.SamplingParams(temperature=1.0, max_tokens=5)
  groups = step.collect_groups(gen, env, tokenizer, env.train, 4, dataclasses.replace(sampling, seed=1))
  for g in groups:
    g.rewards = [Reward(float(i % 2)) for i in range(4)]
  kept, _ = step.assign_advantages(groups, config)
  return kept


def test_one_minibatch_takes_its_step_without_a_prev_logprob_pass(tokenizer):
  """One minibatch: prev logprobs are the step's own logprobs detached (no separate forward
  pass), and the update equals the one taken against recomputed prev logprobs."""
  policy = BigramPolicy(len(tokenizer), micro_batch_size=3)
  twin = BigramPolicy(len(tokenizer), micro_batch_size=3)
  gen = BigramGenerator(np.asarray(policy.table), tokenizer.eos_token_id)
  env = MathEnv(MathConfig(num_train=4, num_validation=0))
  config = math_config()
  kept = _alternating_reward_groups(gen, env, tokenizer, config)
  before = np.asarray(policy.table).copy()
  pg, _ = policy_factory.make_losses(config)
  passes = []
  real_logprobs = policy.logprobs
  policy.logprobs = lambda b: (passes.append(b.batch_size), real_logprobs(b))[1]
  m = step.train_on_groups(policy, kept, pg, pad_id=tokenizer.pad_token_id)
  assert passes == []
  # The twin takes the same step the old way: prev logprobs from a forward pass first.
  batch = make_train_batch(kept, tokenizer.pad_token_id, step.PAD_MULTIPLE)
  batch.extras["prev_logprobs"] = np.asarray(twin.logprobs(batch), np.float32) * batch.loss_mask
  twin_m = twin.train_step(batch, pg)
  np.testing.assert_allclose(np.asarray(policy.table), np.asarray(twin.table), atol=1e-6)
  assert m["train/loss"] == pytest.approx(twin_m["loss"], abs=1e-6)
  assert m["train/is_weight_mean"] == pytest.approx(twin_m["is_weight_mean"], abs=1e-6)
  # The generator sampled from the same weights in float64: ratio 1, IS weights ~1, nothing clipped.
  assert m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
  assert m["train/is_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
  assert m["train/is_logprob_abs_diff_mean"] < 1e-4
  assert m["train/is_truncated_fraction"] == 0.0
  assert m["train/clip_fraction"] == 0.0
  assert m["train/sequences"] == 16
  assert not np.allclose(before, np.asarray(policy.table))
  # Two minibatches: the second is off-policy, so prev logprobs are taken once, up front.
  step.train_on_groups(policy, kept, pg, pad_id=tokenizer.pad_token_id, num_minibatches=2)
  assert passes == [16]
  with pytest.raises(ValueError, match="reference"):
    step.train_on_groups(policy, kept, pg, pad_id=0, kl_coef=0.1)


def test_the_loop_trains_at_the_sampling_temperature(tokenizer):
  """rollout.temperature=0.7: the loop's train step packs the batch at T, so prev logprobs (and
  every minibatch) score the distribution the generator sampled from; IS weights are 1. Scored
  at T=1 (the old behaviour), the same groups give IS weights far from 1."""
  env = MathEnv(MathConfig(num_train=4, num_validation=0))
  config = math_config(**{"rollout.temperature": 0.7, "grpo.num_minibatches": 2,
                          "loss_fn.reference_policy_kl_penalty": 0.05})
  policy = BigramPolicy(len(tokenizer), micro_batch_size=3)
  policy.table = policy.table * 20.0   # a peaked model, so the temperature matters
  reference = BigramPolicy(len(tokenizer))
  reference.table, ref_logprobs, ref_seen = policy.table, reference.logprobs, []
  reference.logprobs = lambda b: (ref_seen.append(b.temperature), ref_logprobs(b))[1]
  settings = harness.RunSettings.build(config, tokenizer, policy_factory.make_losses(config),
                                       reference=reference)
  assert settings.sampling.temperature == 0.7
  gen = BigramGenerator(np.asarray(policy.table), tokenizer.eos_token_id)
  kept = _alternating_reward_groups(gen, env, tokenizer, config,
                                    dataclasses.replace(settings.sampling, max_tokens=5))
  seen = []
  real_step = policy.train_step
  policy.train_step = lambda b, fn: (seen.append(b.temperature), real_step(b, fn))[1]
  raw_policy = BigramPolicy(len(tokenizer), micro_batch_size=3)
  raw_policy.table = policy.table
  m = step.update_policy(policy, kept, settings, reference)
  assert seen == [0.7, 0.7] and ref_seen == [0.7]   # both minibatches; the KL reference too
  assert m["train/is_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
  assert m["train/is_logprob_abs_diff_mean"] < 1e-4
  assert m["train/sequences"] == 16
  raw = step.train_on_groups(raw_policy, kept, settings.update_loss, pad_id=0,
                             kl_coef=settings.kl_coef, reference=reference, temperature=1.0)
  assert raw["train/is_logprob_abs_diff_mean"] > 0.1


def test_minibatches_take_one_step_each_against_the_batch_prev_logprobs(tokenizer):
  """num_minibatches=4: four optimizer steps on disjoint row slices; from the second on, the
  policy has moved since prev_logprobs were taken, so the ratio is no longer 1 (clipping can act)."""
  env = MathEnv(MathConfig(num_train=4, num_validation=0))
  config = math_config()
  pg, _ = policy_factory.make_losses(config)
  policy = BigramPolicy(len(tokenizer), lr=0.5, micro_batch_size=3)
  gen = BigramGenerator(np.asarray(policy.table), tokenizer.eos_token_id)
  kept = _alternating_reward_groups(gen, env, tokenizer, config)
  ratios = []
  real_step = policy.train_step
  policy.train_step = lambda b, fn: (ratios.append(b.batch_size), real_step(b, fn))[1]
  m = step.train_on_groups(policy, kept, pg, pad_id=tokenizer.pad_token_id,
                           num_minibatches=4)
  assert policy.step == 4 and ratios == [4, 4, 4, 4] and m["train/minibatches"] == 4
  assert m["train/sequences"] == 16
  assert abs(m["train/ratio_mean"] - 1.0) > 1e-4     # the mean over the 4 steps: later ones moved
  parts = step.split_rows(make_train_batch(kept, tokenizer.pad_token_id, 16), 3)
  assert [p.batch_size for p in parts] == [5, 5, 6]
  assert all(p.extras["advantages"].shape[0] == p.batch_size for p in parts)
  with pytest.raises(validate.ConfigError, match="num_minibatches"):
    math_config(**{"grpo.num_minibatches": 0})


def test_sft_warmup_lowers_nll_and_sets_lr(tokenizer):
  env = MathEnv(MathConfig(num_train=20, num_validation=0))
  policy = BigramPolicy(len(tokenizer), lr=0.01)
  hist = sft_warmup(policy, env, tokenizer, env.train, steps=15, batch_size=8, lr=0.1,
                    loss_fn=jax_loss.nll_loss, seed=0)
  assert len(hist) == 15 and hist[-1]["nll"] < hist[0]["nll"] * 0.7
  assert policy.lr_calls == [0.1, None]


def test_best_k_keeps_the_top_and_deletes_the_rest(tmp_path):
  saved = []

  def save(d):
    saved.append(d)
    os.makedirs(d)
    open(os.path.join(d, "w"), "w").close()
  best = checkpoints.BestK(str(tmp_path), k=2, mode="max")
  assert [best.offer(s, v, save) for s, v in [(1, 0.2), (2, 0.5), (3, 0.1), (4, 0.7)]] == [True, True, False, True]
  assert [e["step"] for e in best.entries] == [4, 2]
  assert sorted(os.listdir(tmp_path / "best")) == ["best_k.json", "step_000002", "step_000004"]
  assert checkpoints.BestK(str(tmp_path), k=2).best["step"] == 4   # reloaded from best_k.json
  low = checkpoints.BestK(str(tmp_path / "min"), k=1, mode="min")
  assert low.offer(1, 0.5, save) and low.offer(2, 0.4, save) and not low.offer(3, 0.45, save)
  with pytest.raises(ValueError, match="keep_top_k"):
    checkpoints.BestK(str(tmp_path), k=0)


def _parts(tokenizer, seed=0):
  policy = BigramPolicy(len(tokenizer), lr=0.5, micro_batch_size=8, seed=seed)
  gen = BigramGenerator(np.asarray(policy.table), tokenizer.eos_token_id)
  return policy, gen, FakeSynchronizer(policy, gen)


def test_grpo_train_learns_logs_checkpoints_and_resumes(tokenizer, tmp_path):
  config = math_config(**{"logging.png_curve": True})
  env = FirstDigitEnv(MathConfig.from_config(config))
  policy, gen, sync = _parts(tokenizer)
  workdir = str(tmp_path / "run")
  res = run_grpo(config, policy=policy, generator=gen, synchronizer=sync, env=env,
                 tokenizer=tokenizer, train_tasks=env.train, val_tasks=env.validation,
                 workdir=workdir, progress=False)
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  steps = [r for r in rows if "reward/raw_mean" in r]
  assert [r["step"] for r in steps] == list(range(1, 13))
  first, last = np.mean([r["reward/raw_mean"] for r in steps[:3]]), np.mean([r["reward/raw_mean"] for r in steps[-3:]])
  assert last > first + 0.3, (first, last)
  for key in ("groups/zero_variance_fraction", "train/clip_fraction", "train/kl", "train/is_ratio_mean",
              "refit/canary_max_abs_logprob_delta", "rollout/entropy_approx", "rollout/completion_len_mean",
              "perf/tokens_per_s", "time/generate", "time/score", "time/train", "time/refit", "weight_version"):
    assert key in steps[-1], key
  assert steps[-1]["refit/canary_max_abs_logprob_delta"] < 1e-5
  assert [r["step"] for r in rows if "val/reward_mean" in r] == [0, 4, 8, 12]
  samples = [json.loads(line) for line in open(os.path.join(workdir, harness.VAL_SAMPLES))]
  assert [r["step"] for r in samples] == [s for s in (0, 4, 8, 12) for _ in range(8)]
  by_step = {s: np.mean([r["reward"] for r in samples if r["step"] == s]) for s in (0, 4, 8, 12)}
  assert by_step == pytest.approx({r["step"]: r["val/reward_mean"] for r in rows if "val/reward_mean" in r})
  assert {"instance_id", "completion", "reward", "success", "malformed", "reason"} <= set(samples[0])
  # val/pass@1: the share of successes among the 8 greedy samples, inside its Wilson interval.
  for r in (r for r in rows if "val/reward_mean" in r):
    wins = sum(s["success"] for s in samples if s["step"] == r["step"])
    assert r["val/pass@1"] == pytest.approx(wins / 8) == pytest.approx(r["val/reward_mean"])
    assert (r["val/pass@1_ci95_lo"], r["val/pass@1_ci95_hi"]) == pytest.approx(estimators.wilson_interval(wins, 8))
    assert r["val/pass@1_ci95_lo"] <= r["val/pass@1"] <= r["val/pass@1_ci95_hi"]
  # refit after every step, in order, and generation only ever saw fresh weights
  assert sync.calls == ["sync_weights", "prepare_for_generation"] * 12
  assert gen.weight_version == policy.step == 12 == steps[-1]["weight_version"]
  assert gen.requests[0] == (8, 1, 0.0, config.run.seed)          # validation: greedy, one each
  assert gen.requests[1][:3] == (4, 8, 1.0)
  best_dir = os.path.join(workdir, "checkpoints", "best")
  assert len([d for d in os.listdir(best_dir) if d.startswith("step_")]) == 2    # keep_top_k
  assert res.best["value"] == max(v["val/reward_mean"] for v in res.val_history)
  assert os.path.exists(os.path.join(res.best["path"], "bigram.npz"))
  assert os.path.exists(os.path.join(workdir, "checkpoints", "latest", "loop_state.json"))
  assert os.path.exists(os.path.join(workdir, "curves.png"))

  # Resume into the same workdir with more steps: starts after step 12 from the saved weights.
  config2 = math_config(**{"grpo.max_num_steps": 14})
  policy2, gen2, sync2 = _parts(tokenizer, seed=7)
  res2 = run_grpo(config2, policy=policy2, generator=gen2, synchronizer=sync2, env=env,
                  tokenizer=tokenizer, train_tasks=env.train, val_tasks=env.validation,
                  workdir=workdir, progress=False)
  assert res2.resumed_from == 12 and policy2.step == 14
  assert sync2.calls[:2] == ["sync_weights", "prepare_for_generation"]
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in rows if "reward/raw_mean" in r][-2:] == [13, 14]
  # the last step (14, off the period of 4) validates too: a run ends on its final weights' score
  assert [r["step"] for r in rows if "val/reward_mean" in r] == [0, 4, 8, 12, 14]
  assert [v["step"] for v in res2.val_history] == [14]


def test_grpo_train_rejects_an_unknown_checkpoint_metric(tokenizer, tmp_path):
  config = math_config(**{"checkpoint.metric": "val/resolve_rate", "grpo.max_num_steps": 1})
  env = MathEnv(MathConfig.from_config(config))
  policy, gen, sync = _parts(tokenizer)
  with pytest.raises(ValueError, match="checkpoint.metric 'val/resolve_rate'.*val/accuracy"):
    run_grpo(config, policy=policy, generator=gen, synchronizer=sync, env=env, tokenizer=tokenizer,
             train_tasks=env.train, val_tasks=env.validation, workdir=str(tmp_path), progress=False)


def test_make_losses_follows_the_backend():
  config = math_config()
  pg, nll = policy_factory.make_losses(config)
  assert nll is jax_loss.nll_loss and callable(pg)
  config.policy.backend = "torch"
  from dockyard.trainer_torch import loss as torch_loss
  pg_t, nll_t = policy_factory.make_losses(config)
  assert nll_t is torch_loss.nll_loss and callable(pg_t)
  assert LossConfig.from_config(config).max_completion_tokens == 6


def test_prompt_sampler_epochs_are_seeded_permutations():
  tasks = [{"instance_id": i} for i in range(5)]
  s = step.PromptSampler(tasks, seed=3)
  first = [t["instance_id"] for t in s.next(3) + s.next(3)]
  assert sorted(first[:5]) == [0, 1, 2, 3, 4] and s.state() == {"epoch": 1, "pos": 1}
  again = step.PromptSampler(tasks, seed=3)
  again.load({"epoch": 1, "pos": 1})
  assert again.next(4) == s.next(4)
  assert [t["instance_id"] for t in step.PromptSampler(tasks, seed=3).next(12)][:6] == first
  with pytest.raises(ValueError, match="no training tasks"):
    step.PromptSampler([], seed=0)


def test_gdpo_uses_the_env_reward_components():
  config = math_config(**{"grpo.advantage.estimator": "gdpo"})
  env = MathEnv(MathConfig(num_train=1, num_validation=0))
  task = env.train[0]
  texts = [str(task["answer"]), "nothing", str(task["answer"] + 1), str(task["answer"] + 2)]

  async def score():
    return [await env.score(task, t) for t in texts]
  g = Group(task, [1], [comp([1], [-1.0])] * 4, texts=texts, rewards=asyncio.run(score()))
  step.assign_advantages([g], config)
  z = lambda x: (np.array(x) - np.mean(x)) / np.std(x)
  # components: correct, format, and the shaping penalty (math config: malformed_penalty 0.2)
  np.testing.assert_allclose(g.advantages, z([1, 0, 0, 0]) + z([1, 0, 1, 1]) + z([0, -0.2, 0, 0]),
                             rtol=1e-4)   # eps in the std


def test_kl_reference_is_the_policy_after_the_warm_start_and_survives_resume(tokenizer, tmp_path):
  """The runner passes a factory (a policy from the initial checkpoint); the loop loads the
  post-warm-start weights into it (checkpoints/reference/) and trains with the KL term."""
  config = math_config(**{"loss_fn.reference_policy_kl_penalty": 0.1, "grpo.sft_warmup.steps": 5,
                          "grpo.max_num_steps": 3, "grpo.val_period": 0})
  env = FirstDigitEnv(MathConfig.from_config(config))
  policy, gen, sync = _parts(tokenizer)
  initial = np.asarray(policy.table).copy()
  built = []

  def make_reference():
    built.append(BigramPolicy(len(tokenizer), lr=0.5, micro_batch_size=8, seed=0))   # = initial
    return built[-1]

  workdir = str(tmp_path / "run")
  kw = dict(policy=policy, generator=gen, synchronizer=sync, env=env, tokenizer=tokenizer,
            train_tasks=env.train, val_tasks=env.validation, workdir=workdir, progress=False)
  run_grpo(config, reference=make_reference, **kw)
  snap = os.path.join(workdir, "checkpoints", harness.REFERENCE_DIR, "bigram.npz")
  after_sft = np.load(snap)["table"]
  assert not np.allclose(after_sft, initial)            # the warm start moved the policy ...
  np.testing.assert_array_equal(np.asarray(built[0].table), after_sft)   # ... and the reference is it
  assert not np.allclose(np.asarray(policy.table), after_sft)            # GRPO then moved the policy on
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  kls = [r["train/kl"] for r in rows if r.get("train/kl") is not None]
  assert len(kls) == 3 and kls[-1] > 0
  # Resume with more steps: the reference comes back from the snapshot, not from the initial weights.
  config.grpo.max_num_steps = 4
  run_grpo(config, reference=make_reference, **kw)
  np.testing.assert_array_equal(np.asarray(built[1].table), after_sft)
  with pytest.raises(ValueError, match="reference"):
    run_grpo(config, **kw)


def test_progress_draws_the_warm_start_and_the_steps(tokenizer, tmp_path, capsys):
  config = math_config(**{"grpo.sft_warmup.steps": 3, "grpo.max_num_steps": 2, "grpo.val_period": 0})
  env = FirstDigitEnv(MathConfig.from_config(config))
  policy, gen, sync = _parts(tokenizer)
  run_grpo(config, policy=policy, generator=gen, synchronizer=sync, env=env, tokenizer=tokenizer,
           train_tasks=env.train, val_tasks=env.validation, workdir=str(tmp_path), progress=True)
  err = capsys.readouterr().err
  assert "sft warm start: 100%" in err and " 3/3 " in err and "loss " in err
  assert " 2/2 " in err and "reward " in err and "clip" not in err

"""The DPO-family preference loss: the NumPy spec by hand on 2 pairs, JAX and torch against the spec
(values, metrics, gradients), masks and padding, micro-batching, config validation."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dockyard.dpo import loss_spec
from dockyard.dpo.loss_spec import PreferenceConfig
from dockyard.trainer_jax import preference_loss as jax_pref
from dockyard.trainer_torch import preference_loss as torch_pref


def sp(x):  # softplus: -log sigma(h) = sp(-h)
  return math.log1p(math.exp(x))


# Two pairs, T=4, position 0 the prompt; values at masked positions are garbage that must not count.
#   pair 0: chosen   pi = -1 - 2 = -3 (2 tokens),    ref = -4;  rejected pi = -6 (3 tokens), ref = -5
#   pair 1: chosen   pi = -0.5 (1 token),            ref = -0.25; rejected pi = -0.5 (2), ref = -1
LP = np.array([[0.0, -1.0, -2.0, -9.0],
               [0.0, -2.0, -2.0, -2.0],
               [0.0, -0.5, -8.0, -8.0],
               [0.0, -0.25, -0.25, -7.0]], np.float32)
MASK = np.array([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0]], np.float32)
REF = np.array([[0.0, -2.0, -2.0, 5.0],
                [0.0, -1.0, -2.0, -2.0],
                [0.0, -0.25, 3.0, 3.0],
                [0.0, -0.5, -0.5, 9.0]], np.float32)


def spec(cfg, lp=LP, mask=MASK, ref=REF):
  return loss_spec.preference_loss(lp, mask, {"reference_logprobs": ref}, cfg)


def test_dpo_cdpo_dpop_rdpo_sft_by_hand():
  # DPO, beta 0.5: logratio differences 1 - (-1) = 2 and -0.25 - 0.5 = -0.75, so h = 1, -0.375.
  loss, m = spec(PreferenceConfig(mode="dpo", beta=0.5))
  assert loss == pytest.approx((sp(-1.0) + sp(0.375)) / 2)
  assert m["rewards_chosen"] == pytest.approx((0.5 - 0.125) / 2)
  assert m["rewards_rejected"] == pytest.approx((-0.5 + 0.25) / 2)
  assert m["reward_margin"] == pytest.approx((1.0 - 0.375) / 2)
  assert m["reward_accuracy"] == pytest.approx(0.5)
  assert m["sft_nll"] == pytest.approx((1.5 + 0.5) / 2)
  # cDPO, eps 0.1: 0.9 (-log sigma(h)) + 0.1 (-log sigma(-h)).
  loss, _ = spec(PreferenceConfig(mode="dpo", beta=0.5, label_smoothing=0.1))
  assert loss == pytest.approx((0.9 * sp(-1.0) + 0.1 * sp(1.0) + 0.9 * sp(0.375) + 0.1 * sp(-0.375)) / 2)
  # DPOP, lambda 2: pair 0's chosen is above the reference (no penalty); pair 1's is 0.25 below,
  # so h1 = 0.5 (-0.75 - 2 * 0.25) = -0.625.
  loss, m = spec(PreferenceConfig(mode="dpo", beta=0.5, dpop_lambda=2.0))
  assert loss == pytest.approx((sp(-1.0) + sp(0.625)) / 2)
  assert m["reward_margin"] == pytest.approx((1.0 - 0.375) / 2)   # the penalty is not a reward
  # R-DPO, alpha 0.2: both pairs have |y_w| - |y_l| = -1, so h gains +0.2.
  loss, _ = spec(PreferenceConfig(mode="dpo", beta=0.5, length_alpha=0.2))
  assert loss == pytest.approx((sp(-1.2) + sp(0.175)) / 2)
  # + SFT 0.3: chosen per-token NLLs 1.5 and 0.5.
  loss, m = spec(PreferenceConfig(mode="dpo", beta=0.5, sft_weight=0.3))
  assert loss == pytest.approx((sp(-1.0) + sp(0.375)) / 2 + 0.3 * 1.0)
  assert m["preference_loss"] == pytest.approx((sp(-1.0) + sp(0.375)) / 2)


def test_ipo_simpo_orpo_by_hand():
  # IPO, beta 0.5 (target 1) on per-token averages: pair 0 (-1.5 + 2) - (-2 + 5/3) = 5/6;
  # pair 1 (-0.5 + 0.25) - (-0.25 + 0.5) = -0.5.
  loss, m = spec(PreferenceConfig(mode="ipo", beta=0.5))
  assert loss == pytest.approx(((5 / 6 - 1) ** 2 + (-0.5 - 1) ** 2) / 2)
  assert m["reward_margin"] == pytest.approx(0.5 * (5 / 6 - 0.5) / 2)
  assert m["reward_accuracy"] == pytest.approx(0.5)
  # SimPO, beta 2, gamma 0.5: pair 0 2(-1.5) - 2(-2) - 0.5 = 0.5; pair 1 2(-0.5) - 2(-0.25) - 0.5 = -1.
  loss, m = spec(PreferenceConfig(mode="simpo", beta=2.0, simpo_gamma=0.5))
  assert loss == pytest.approx((sp(-0.5) + sp(1.0)) / 2)
  assert m["rewards_chosen"] == pytest.approx((-3.0 - 1.0) / 2)
  # ORPO, lambda 0.1: NLL (1.5 + 0.5) / 2 plus the odds-ratio term on the averages.
  def logodds(a):
    return a - math.log(1 - math.exp(a))
  d0, d1 = logodds(-1.5) - logodds(-2.0), logodds(-0.5) - logodds(-0.25)
  loss, m = spec(PreferenceConfig(mode="orpo", orpo_lambda=0.1))
  assert loss == pytest.approx(1.0 + 0.1 * (sp(-d0) + sp(-d1)) / 2)
  assert m["reward_margin"] == pytest.approx((d0 + d1) / 2)
  # The reference-free modes never read the reference.
  assert loss_spec.preference_loss(LP, MASK, {}, PreferenceConfig(mode="orpo", orpo_lambda=0.1))[0] \
      == loss


def test_orpo_log_odds_stay_finite_at_certainty():
  lp = np.array([[0.0, 0.0], [0.0, -1.0]], np.float32)      # the chosen completion has p = 1
  mask = np.array([[0, 1], [0, 1]], np.float32)
  cfg = PreferenceConfig(mode="orpo", orpo_lambda=0.1)
  loss, _ = loss_spec.preference_loss(lp, mask, {}, cfg)
  assert np.isfinite(loss)
  g = jax.grad(lambda x: jax_pref.preference_loss(x, mask, {}, cfg)[0])(jnp.asarray(lp))
  assert np.all(np.isfinite(np.asarray(g)))


GRID = [
    PreferenceConfig(mode="dpo", beta=0.1),
    PreferenceConfig(mode="dpo", beta=0.5, label_smoothing=0.1),
    PreferenceConfig(mode="dpo", beta=0.5, dpop_lambda=5.0),
    PreferenceConfig(mode="dpo", beta=0.3, length_alpha=0.05),
    PreferenceConfig(mode="dpo", beta=0.3, label_smoothing=0.2, dpop_lambda=2.0, length_alpha=0.1,
                     sft_weight=0.5),
    PreferenceConfig(mode="ipo", beta=0.1),
    PreferenceConfig(mode="ipo", beta=1.0, sft_weight=0.2),
    PreferenceConfig(mode="simpo", beta=2.0, simpo_gamma=0.5),
    PreferenceConfig(mode="simpo", beta=2.5, simpo_gamma=1.4, sft_weight=0.3),
    PreferenceConfig(mode="orpo", orpo_lambda=0.1),
    PreferenceConfig(mode="orpo", orpo_lambda=1.0),
]


def cfg_id(c):
  return "-".join(f"{f.name}{getattr(c, f.name)}" if f.name != "mode" else c.mode
                  for f in c.__dataclass_fields__.values()
                  if f.name == "mode" or getattr(c, f.name) != f.default)


def run_jax(lp, mask, extras, cfg):
  def f(x):
    return jax_pref.preference_loss(x, jnp.asarray(mask),
                                    {k: jnp.asarray(v) for k, v in extras.items()}, cfg)
  (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(lp))
  return float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad)


def run_torch(lp, mask, extras, cfg):
  x = torch.tensor(lp, requires_grad=True)
  loss, metrics = torch_pref.preference_loss(x, torch.as_tensor(mask),
                                             {k: torch.as_tensor(v) for k, v in extras.items()}, cfg)
  loss.backward()
  return float(loss.detach()), {k: float(v) for k, v in metrics.items()}, x.grad.numpy()


@pytest.mark.parametrize("cfg", GRID, ids=cfg_id)
def test_jax_and_torch_match_the_spec(cfg):
  rng = np.random.default_rng(0)
  lp, mask, extras = loss_spec.random_pairs(rng, pairs=5, reference=cfg.needs_reference)
  want, want_m = loss_spec.preference_loss(lp, mask, extras, cfg)
  assert set(want_m) == set(loss_spec.METRICS)
  grads = []
  for run in (run_jax, run_torch):
    got, got_m, grad = run(lp, mask, extras, cfg)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6), run.__name__
    assert set(got_m) == set(want_m)
    for k in want_m:
      assert got_m[k] == pytest.approx(want_m[k], rel=1e-5, abs=1e-6), (run.__name__, k)
    assert np.all(grad[mask == 0] == 0), "masked positions (prompt, padding) must get no gradient"
    grads.append(grad)
  np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-7)
  # ... and both against central differences of the float64 spec.
  h, fd = 1e-5, np.zeros(lp.shape)
  for i, j in zip(*np.nonzero(mask)):
    up, down = lp.astype(np.float64), lp.astype(np.float64)
    up[i, j] += h
    down[i, j] -= h
    fd[i, j] = (loss_spec.preference_loss(up, mask, extras, cfg)[0]
                - loss_spec.preference_loss(down, mask, extras, cfg)[0]) / (2 * h)
  np.testing.assert_allclose(grads[1], fd, rtol=1e-3, atol=1e-5)
  assert np.abs(fd).sum() > 0


@pytest.mark.parametrize("cfg", [GRID[4], GRID[6], GRID[8], GRID[10]], ids=cfg_id)
def test_masks_padding_and_per_sequence_reference_change_nothing(cfg):
  rng = np.random.default_rng(3)
  lp, mask, extras = loss_spec.random_pairs(rng, pairs=4, reference=True)
  want, want_m = loss_spec.preference_loss(lp, mask, extras, cfg)
  # garbage where the mask is 0, in the policy's and the reference's logprobs
  noise = np.where(mask == 0, rng.normal(scale=50.0, size=lp.shape), 0.0).astype(np.float32)
  dirty = dict(reference_logprobs=extras["reference_logprobs"] + noise)
  # the reference as per-sequence sums [B] (cached per data set) instead of per token
  per_seq = dict(reference_logprobs=(extras["reference_logprobs"] * mask).sum(-1))
  for run in (run_jax, run_torch):
    for ex in (dirty, per_seq):
      got, got_m, _ = run(lp + noise, mask, ex, cfg)
      assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
      for k in want_m:
        assert got_m[k] == pytest.approx(want_m[k], rel=1e-5, abs=1e-6), k


@pytest.mark.parametrize("cfg", [GRID[4], GRID[6], GRID[8], GRID[9]], ids=cfg_id)
def test_micro_batches_sum_to_the_full_batch(cfg):
  rng = np.random.default_rng(1)
  # the last pair is empty (the trainer's padding rows)
  lp, mask, extras = loss_spec.random_pairs(rng, pairs=5, reference=cfg.needs_reference)
  # what the trainers add (no total_pairs: the loss falls back to total_sequences / 2), and an
  # explicit count
  trainer_totals = dict(total_tokens=np.float32(mask.sum()),
                        total_sequences=np.float32((mask.sum(-1) > 0).sum()))
  for totals in (trainer_totals, dict(total_pairs=np.float32(4))):
    for run in (run_jax, run_torch):
      full, full_m, full_g = run(lp, mask, extras, cfg)
      parts, grads, metrics = 0.0, [], dict.fromkeys(full_m, 0.0)
      for s in (slice(0, 2), slice(2, 8), slice(8, 10)):    # uneven; the last holds only the empty pair
        got, m, g = run(lp[s], mask[s], {**{k: v[s] for k, v in extras.items()}, **totals}, cfg)
        parts += got
        grads.append(g)
        for k in m:
          metrics[k] += m[k]
      assert parts == pytest.approx(full, rel=1e-5, abs=1e-7)
      np.testing.assert_allclose(np.concatenate(grads), full_g, rtol=1e-5, atol=1e-8)
      for k in full_m:
        assert metrics[k] == pytest.approx(full_m[k], rel=1e-5, abs=1e-7), k
  spec_parts = sum(
      loss_spec.preference_loss(lp[s], mask[s], {**{k: v[s] for k, v in extras.items()},
                                                 **trainer_totals}, cfg)[0]
      for s in (slice(0, 4), slice(4, 10)))
  assert spec_parts == pytest.approx(loss_spec.preference_loss(lp, mask, extras, cfg)[0], rel=1e-12)


def test_jitted_loss_fn_with_traced_totals():
  cfg = GRID[4]
  rng = np.random.default_rng(2)
  lp, mask, extras = loss_spec.random_pairs(rng, pairs=3)
  fn = jax.jit(jax.value_and_grad(jax_pref.make_preference_loss(cfg), has_aux=True))
  (loss, _), _ = fn(jnp.asarray(lp), jnp.asarray(mask),
                    {**extras, "total_sequences": jnp.float32(4.0)})
  want, _ = loss_spec.preference_loss(lp, mask, extras, cfg)
  assert float(loss) == pytest.approx(want, rel=1e-5)
  got, _ = torch_pref.make_preference_loss(cfg)(torch.as_tensor(lp), torch.as_tensor(mask),
                                               {k: torch.as_tensor(v) for k, v in extras.items()})
  assert float(got) == pytest.approx(want, rel=1e-5)


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
  rng = np.random.default_rng(4)
  lp, mask, extras = loss_spec.random_pairs(rng, pairs=6, empty_pair=False)
  for run in (run_jax, run_torch):
    _, _, g = run(lp, mask, extras, PreferenceConfig(mode="dpo", beta=0.1))
    chosen, rejected = g[0::2][mask[0::2] > 0], g[1::2][mask[1::2] > 0]
    assert np.all(chosen < 0) and np.all(rejected > 0)   # descent raises chosen, lowers rejected


@pytest.mark.parametrize("kwargs, field", [
    (dict(mode="kto"), "mode"),
    (dict(mode="dpo", beta=0.0), "beta"),
    (dict(mode="dpo", beta=-1.0), "beta"),
    (dict(mode="ipo", label_smoothing=0.1), "label_smoothing"),
    (dict(mode="dpo", label_smoothing=0.5), "label_smoothing"),
    (dict(mode="simpo", dpop_lambda=1.0), "dpop_lambda"),
    (dict(mode="orpo", orpo_lambda=0.1, dpop_lambda=1.0), "dpop_lambda"),
    (dict(mode="ipo", dpop_lambda=1.0), "dpop_lambda"),
    (dict(mode="simpo", length_alpha=0.1), "length_alpha"),
    (dict(mode="dpo", simpo_gamma=0.5), "simpo_gamma"),
    (dict(mode="dpo", orpo_lambda=0.1), "orpo_lambda"),
    (dict(mode="orpo"), "orpo_lambda"),
    (dict(mode="orpo", orpo_lambda=0.1, sft_weight=1.0), "sft_weight"),
    (dict(mode="dpo", sft_weight=float("nan")), "sft_weight"),
])
def test_impossible_configs_are_rejected_naming_the_field(kwargs, field):
  with pytest.raises(ValueError, match=f"preference.{field}"):
    PreferenceConfig(**kwargs)


def test_bad_inputs_are_named():
  cfg = PreferenceConfig(mode="dpo")
  with pytest.raises(KeyError, match="reference_logprobs"):
    jax_pref.preference_loss(jnp.asarray(LP), MASK, {}, cfg)
  with pytest.raises(KeyError, match="reference_logprobs"):
    torch_pref.preference_loss(torch.as_tensor(LP), MASK, {}, cfg)
  with pytest.raises(ValueError, match="B even"):
    loss_spec.preference_loss(LP[:3], MASK[:3], {"reference_logprobs": REF[:3]}, cfg)
  with pytest.raises(ValueError, match="B even"):
    torch_pref.preference_loss(torch.as_tensor(LP[:3]), MASK[:3], {"reference_logprobs": REF[:3]}, cfg)

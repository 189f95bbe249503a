"""The clipped-PG loss: NumPy spec by hand, JAX against the spec, masks, padding, micro-batching."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dockyard.grpo import loss_spec
from dockyard.grpo.loss_spec import LossConfig
from dockyard.trainer_jax import loss as jax_loss


random_batch = loss_spec.random_batch


GRID = [LossConfig(ratio_clip_min=0.2, ratio_clip_max=hi, ratio_clip_c=c, reference_policy_kl_penalty=kl,
                   use_importance_sampling_correction=isc, ratio_level=level, normalization=norm,
                   max_completion_tokens=12)
        for hi, c, kl, isc, level, norm in itertools.product(
            (0.28,), (0.0, 3.0), (0.0, 0.05), (False, True), loss_spec.RATIO_LEVELS,
            loss_spec.NORMALIZATIONS)]


def test_hand_computed_token_case():
  # One row, 3 positions; position 0 is the prompt. Ratios: e^0.5 (clipped at 1.28, A>0),
  # e^-0.1 (inside), IS weights e^0 = 1 and e^1 truncated to 2.
  lp = np.array([[0.0, -1.0, -2.0]])
  mask = np.array([[0, 1, 1]])
  extras = dict(advantages=np.array([2.0]), prev_logprobs=np.array([[0.0, -1.5, -1.9]]),
                generation_logprobs=np.array([[0.0, -1.5, -2.9]]))
  cfg = LossConfig(ratio_clip_min=0.2, ratio_clip_max=0.28, ratio_clip_c=3.0)
  loss, metrics = loss_spec.clipped_pg_loss(lp, mask, extras, cfg)
  pg1 = -2.0 * 1.28                    # max(-2 e^0.5, -2 * 1.28)
  pg2 = -2.0 * np.exp(-0.1)            # ratio inside [0.8, 1.28]
  assert loss == pytest.approx((1.0 * pg1 + 2.0 * pg2) / 2)
  assert metrics["clip_fraction"] == pytest.approx(0.5)
  assert metrics["is_weight_mean"] == pytest.approx(1.5)
  assert metrics["ratio_mean"] == pytest.approx((np.exp(0.5) + np.exp(-0.1)) / 2)
  # trainer vs sampler before truncation: prev - gen = 0 and 1 on the two loss tokens
  assert metrics["is_ratio_mean"] == pytest.approx((1.0 + np.e) / 2)
  assert metrics["is_logprob_abs_diff_mean"] == pytest.approx(0.5)
  assert metrics["is_truncated_fraction"] == pytest.approx(0.5)


def test_hand_computed_dual_clip_and_kl():
  # Negative advantage with a huge ratio: plain PPO gives -A r = 10 e^2; dual clip caps at -A c = 3.
  lp, mask = np.array([[-1.0]]), np.array([[1.0]])
  extras = dict(advantages=np.array([-1.0]), prev_logprobs=np.array([[-3.0]]),
                reference_logprobs=np.array([[-1.5]]))
  cfg = LossConfig(ratio_clip_c=3.0, reference_policy_kl_penalty=0.1,
                   use_importance_sampling_correction=False)
  loss, metrics = loss_spec.clipped_pg_loss(lp, mask, extras, cfg)
  k3 = np.exp(-0.5) + 0.5 - 1.0
  assert loss == pytest.approx(3.0 + 0.1 * k3)
  assert metrics["dual_clip_fraction"] == 1.0
  assert metrics["kl"] == pytest.approx(k3)


def test_hand_computed_sequence_and_dr_grpo():
  # GSPO: one ratio per row, exp(mean log ratio) = exp((0.1 - 0.3) / 2); Dr.GRPO: / (N_seq * L).
  lp = np.array([[-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0]])
  mask = np.array([[1, 1, 0], [1, 0, 0]])
  extras = dict(advantages=np.array([1.0, -1.0]), prev_logprobs=np.array([[-1.1, -0.7, 0.0], [-2.0, 0, 0]]))
  seq = LossConfig(use_importance_sampling_correction=False, ratio_level="sequence",
                   normalization="sequence", ratio_clip_c=0.0)
  loss, _ = loss_spec.clipped_pg_loss(lp, mask, extras, seq)
  r0 = np.exp(-0.1)
  assert loss == pytest.approx(((-r0 * 2) / 2 + 1.0) / 2)
  dr = LossConfig(use_importance_sampling_correction=False, normalization="constant",
                  max_completion_tokens=4, ratio_clip_c=0.0)
  loss, _ = loss_spec.clipped_pg_loss(lp, mask, extras, dr)
  assert loss == pytest.approx((-np.exp(0.1) - np.exp(-0.3) + 1.0) / (2 * 4))
  # Dr. GRPO over sequence-level ratios: the GSPO ratio r0 on both tokens of row 0, / (N_seq * L).
  dr_seq = LossConfig(use_importance_sampling_correction=False, ratio_level="sequence",
                      normalization="constant", max_completion_tokens=4, ratio_clip_c=0.0)
  loss, _ = loss_spec.clipped_pg_loss(lp, mask, extras, dr_seq)
  assert loss == pytest.approx((-2 * r0 + 1.0) / (2 * 4))


def test_hand_computed_original_grpo_and_token_mean():
  # DeepSeekMath eq. 3: token-level ratios, averaged within each sequence, then over sequences.
  # Row 0 has 2 loss tokens (ratios e^0.1, e^-0.3, A=1), row 1 one token (ratio 1, A=-1).
  lp = np.array([[-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0]])
  mask = np.array([[1, 1, 0], [1, 0, 0]])
  extras = dict(advantages=np.array([1.0, -1.0]), prev_logprobs=np.array([[-1.1, -0.7, 0.0], [-2.0, 0, 0]]))
  grpo = LossConfig(use_importance_sampling_correction=False, ratio_level="token",
                    normalization="sequence", ratio_clip_c=0.0)
  row0 = -np.exp(0.1) - np.exp(-0.3)
  loss, _ = loss_spec.clipped_pg_loss(lp, mask, extras, grpo)
  assert loss == pytest.approx((row0 / 2 + 1.0 / 1) / 2)
  # The token mean weighs row 0's two tokens twice as much as row 1's one.
  dapo = LossConfig(use_importance_sampling_correction=False, ratio_clip_c=0.0)
  assert (dapo.ratio_level, dapo.normalization) == ("token", "token")
  loss, _ = loss_spec.clipped_pg_loss(lp, mask, extras, dapo)
  assert loss == pytest.approx((row0 + 1.0) / 3)
  # GSPO ratios under a token mean: the same sequence ratio on each of row 0's tokens.
  gspo_tok = LossConfig(use_importance_sampling_correction=False, ratio_level="sequence",
                        normalization="token", ratio_clip_c=0.0)
  loss, _ = loss_spec.clipped_pg_loss(lp, mask, extras, gspo_tok)
  assert loss == pytest.approx((-2 * np.exp(-0.1) + 1.0) / 3)


@pytest.mark.parametrize("cfg", GRID, ids=lambda c: f"{c.ratio_clip_max}-{c.ratio_clip_c}-"
                         f"{c.reference_policy_kl_penalty}-{int(c.use_importance_sampling_correction)}-"
                         f"{c.ratio_level}-{c.normalization}")
def test_jax_matches_spec_and_microbatches_sum(cfg):
  rng = np.random.default_rng(hash(cfg) % 2**32)
  lp, mask, extras = random_batch(rng, per_token_adv=cfg.ratio_level == "token")
  want, want_m = loss_spec.clipped_pg_loss(lp, mask, extras, cfg)
  got, got_m = jax_loss.make_pg_loss(cfg)(jnp.asarray(lp), jnp.asarray(mask), extras)
  assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-6)
  for k, v in want_m.items():
    assert float(got_m[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k
  # The micro-batching contract: whole-batch totals in every micro-batch, losses summed.
  totals = dict(total_tokens=np.float32(mask.sum()), total_sequences=np.float32((mask.sum(-1) > 0).sum()))
  parts_np, parts_jax = 0.0, 0.0
  metric_sum = {k: 0.0 for k in want_m}
  for sl in (slice(0, 2), slice(2, 3), slice(3, 5)):
    sub = {k: v[sl] for k, v in extras.items()} | totals
    parts_np += loss_spec.clipped_pg_loss(lp[sl], mask[sl], sub, cfg)[0]
    l, mm = jax_loss.clipped_pg_loss(jnp.asarray(lp[sl]), mask[sl], sub, cfg)
    parts_jax += float(l)
    for k in metric_sum:
      metric_sum[k] += float(mm[k])
  assert parts_np == pytest.approx(want, rel=1e-9, abs=1e-12)
  assert parts_jax == pytest.approx(want, rel=1e-5, abs=1e-6)
  for k, v in want_m.items():
    assert metric_sum[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


@pytest.mark.parametrize("level,norm", [("token", "token"), ("token", "sequence"),
                                        ("sequence", "sequence"), ("sequence", "constant")])
def test_padding_changes_nothing(level, norm):
  rng = np.random.default_rng(1)
  cfg = LossConfig(reference_policy_kl_penalty=0.1, ratio_level=level, normalization=norm,
                   max_completion_tokens=12)
  lp, mask, extras = random_batch(rng)
  base = float(jax_loss.clipped_pg_loss(jnp.asarray(lp), mask, extras, cfg)[0])
  # Extra right-padding columns and an all-padding row, filled with garbage.
  pad = lambda x: np.pad(x, ((0, 1), (0, 4)), constant_values=-7.0)
  padded_extras = {k: (pad(v) if v.ndim == 2 else np.pad(v, (0, 1), constant_values=5.0))
                   for k, v in extras.items()}
  padded_mask = np.pad(mask, ((0, 1), (0, 4)))
  got = float(jax_loss.clipped_pg_loss(jnp.asarray(pad(lp)), padded_mask, padded_extras, cfg)[0])
  assert got == pytest.approx(base, rel=1e-6)
  assert np.isfinite(got)


def test_jax_gradient_matches_finite_differences_of_spec():
  rng = np.random.default_rng(2)
  cfg = LossConfig(reference_policy_kl_penalty=0.05, ratio_clip_c=3.0)
  lp, mask, extras = random_batch(rng, b=3, t=5)
  grad = np.asarray(jax.jit(jax.grad(lambda x: jax_loss.clipped_pg_loss(x, mask, extras, cfg)[0]))(jnp.asarray(lp)))
  lp64 = lp.astype(np.float64)
  fd = np.zeros_like(lp64)
  for idx in np.ndindex(lp.shape):
    e = np.zeros_like(lp64)
    e[idx] = 1e-6
    fd[idx] = (loss_spec.clipped_pg_loss(lp64 + e, mask, extras, cfg)[0]
               - loss_spec.clipped_pg_loss(lp64 - e, mask, extras, cfg)[0]) / 2e-6
  np.testing.assert_allclose(grad, fd, atol=2e-4)
  assert np.abs(grad[mask == 0]).max() == 0.0
  assert np.abs(grad).max() > 0


def test_no_gradient_through_prev_generation_reference():
  rng = np.random.default_rng(3)
  cfg = LossConfig(reference_policy_kl_penalty=0.1)
  lp, mask, extras = random_batch(rng, b=2, t=4)
  for key in ("prev_logprobs", "generation_logprobs", "reference_logprobs", "advantages"):
    def f(x):
      return jax_loss.clipped_pg_loss(jnp.asarray(lp), mask, {**extras, key: x}, cfg)[0]
    g = jax.grad(f)(jnp.asarray(extras[key]))
    assert float(jnp.abs(g).max()) == 0.0, key


@pytest.mark.parametrize("cfg", [GRID[-1], LossConfig(ratio_level="sequence", normalization="sequence")],
                         ids=("token", "sequence"))
def test_absent_prev_logprobs_are_the_logprobs_detached(cfg):
  """The batch's one optimizer step: prev left out = prev equal to the logprobs, in value,
  metrics and gradient (the ratio's gradient is the policy gradient's)."""
  lp, mask, extras = random_batch(np.random.default_rng(5), per_token_adv=cfg.ratio_level == "token")
  without = {k: v for k, v in extras.items() if k != "prev_logprobs"}
  want, want_m = loss_spec.clipped_pg_loss(lp, mask, {**without, "prev_logprobs": lp}, cfg)
  assert loss_spec.clipped_pg_loss(lp, mask, without, cfg) == (want, want_m)

  def jax_fn(ex):
    return jax.value_and_grad(lambda x: jax_loss.clipped_pg_loss(x, mask, ex, cfg), has_aux=True)(jnp.asarray(lp))
  (got, got_m), grad = jax_fn(without)
  _, grad_given = jax_fn({**without, "prev_logprobs": lp})
  assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-6)
  for k, v in want_m.items():
    assert float(got_m[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k
  assert want_m["ratio_mean"] == pytest.approx(1.0)
  np.testing.assert_allclose(np.asarray(grad), np.asarray(grad_given), rtol=1e-6, atol=1e-8)
  assert np.abs(np.asarray(grad)).max() > 0


def test_missing_extras_are_named():
  lp, mask = np.zeros((1, 2)), np.ones((1, 2))
  extras = dict(advantages=np.ones(1), prev_logprobs=np.zeros((1, 2)), generation_logprobs=np.zeros((1, 2)))
  loss_spec.clipped_pg_loss(lp, mask, extras, LossConfig())   # kl 0: no reference needed
  with pytest.raises(KeyError, match="reference_logprobs"):
    jax_loss.clipped_pg_loss(jnp.asarray(lp), mask, extras, LossConfig(reference_policy_kl_penalty=0.1))
  with pytest.raises(ValueError, match="normalization"):
    LossConfig(normalization="token_mean")
  with pytest.raises(ValueError, match="ratio_level"):
    LossConfig(ratio_level="group")
  with pytest.raises(ValueError, match="max_completion_tokens"):
    LossConfig(normalization="constant")


def test_nll_matches_spec_and_microbatches():
  rng = np.random.default_rng(4)
  lp, mask, _ = random_batch(rng)
  want = loss_spec.nll_loss(lp, mask, {})[0]
  assert float(jax_loss.nll_loss(jnp.asarray(lp), mask, {})[0]) == pytest.approx(want, rel=1e-6)
  assert want == pytest.approx(-(lp * mask).sum() / mask.sum())
  tot = dict(total_tokens=np.float32(mask.sum()))
  parts = sum(float(jax_loss.nll_loss(jnp.asarray(lp[s]), mask[s], tot)[0])
              for s in (slice(0, 3), slice(3, 5)))
  assert parts == pytest.approx(want, rel=1e-5)

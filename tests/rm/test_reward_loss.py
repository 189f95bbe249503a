"""The reward model's Bradley-Terry loss: the NumPy spec by hand, JAX and torch against the spec on
random inputs (values, metrics, gradients; with and without margins), batches that add up to the
whole set, and bad inputs named."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dockyard.rm import loss_spec
from dockyard.trainer_jax import reward_loss as jax_rm
from dockyard.trainer_torch import reward_loss as torch_rm


def sp(x):  # softplus: -log sigma(h) = sp(-h)
  return math.log1p(math.exp(x))


def test_bradley_terry_with_margin_by_hand():
  rewards = np.array([2.0, 0.5, -1.0, 0.0, 3.0, 3.0], np.float32)   # pairs: +1.5, -1, 0 (a tie)
  loss, m = loss_spec.reward_loss(rewards, {})
  assert loss == pytest.approx((sp(-1.5) + sp(1.0) + sp(0.0)) / 3)
  assert m["accuracy"] == pytest.approx(1 / 3)          # the tie counts as lost
  assert m["rewards_chosen"] == pytest.approx((2.0 - 1.0 + 3.0) / 3)
  assert m["rewards_rejected"] == pytest.approx((0.5 + 0.0 + 3.0) / 3)
  assert m["reward_margin"] == pytest.approx((1.5 - 1.0 + 0.0) / 3)
  # Margins 1, 0, 0.5 are subtracted inside the sigmoid; the metrics are the rewards' own.
  loss, m2 = loss_spec.reward_loss(rewards, {"margin": np.array([1.0, 0.0, 0.5], np.float32)})
  assert loss == pytest.approx((sp(-0.5) + sp(1.0) + sp(0.5)) / 3)
  assert m2["accuracy"] == m["accuracy"] and m2["reward_margin"] == m["reward_margin"]
  # total_pairs normalizes: the loss of these 3 pairs as a share of a 6-pair set.
  assert loss_spec.reward_loss(rewards, {"total_pairs": 6.0})[0] == pytest.approx(
      loss_spec.reward_loss(rewards, {})[0] / 2)


def run_jax(rewards, extras):
  def f(x):
    return jax_rm.reward_loss(x, {k: jnp.asarray(v) for k, v in extras.items()})
  (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(rewards))
  return float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad)


def run_torch(rewards, extras):
  x = torch.tensor(rewards, requires_grad=True)
  loss, metrics = torch_rm.reward_loss(x, {k: torch.as_tensor(v) for k, v in extras.items()})
  loss.backward()
  return float(loss.detach()), {k: float(v) for k, v in metrics.items()}, x.grad.numpy()


@pytest.mark.parametrize("seed, margin", [(0, False), (1, True), (2, True)])
def test_jax_and_torch_match_the_spec(seed, margin):
  rewards, extras = loss_spec.random_rewards(np.random.default_rng(seed), pairs=7, margin=margin)
  want, want_m = loss_spec.reward_loss(rewards, extras)
  assert set(want_m) == set(loss_spec.METRICS)
  grads = []
  for run in (run_jax, run_torch):
    got, got_m, grad = run(rewards, extras)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6), run.__name__
    assert set(got_m) == set(want_m)
    for k in want_m:
      assert got_m[k] == pytest.approx(want_m[k], rel=1e-5, abs=1e-6), (run.__name__, k)
    grads.append(grad)
  np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-7)
  # ... and against central differences of the float64 spec; descent raises chosen, lowers rejected.
  h, fd = 1e-5, np.zeros(rewards.shape)
  for i in range(rewards.size):
    up, down = rewards.astype(np.float64), rewards.astype(np.float64)
    up[i] += h
    down[i] -= h
    fd[i] = (loss_spec.reward_loss(up, extras)[0] - loss_spec.reward_loss(down, extras)[0]) / (2 * h)
  np.testing.assert_allclose(grads[1], fd, rtol=1e-4, atol=1e-7)
  assert np.all(fd[0::2] < 0) and np.all(fd[1::2] > 0)


def test_a_margin_changes_the_loss_and_gradient_not_the_metrics():
  rewards, extras = loss_spec.random_rewards(np.random.default_rng(5), pairs=6, margin=True)
  assert np.any(extras["margin"] > 0)
  for run in (run_jax, run_torch):
    with_m, m1, g1 = run(rewards, extras)
    without, m0, g0 = run(rewards, {})
    assert with_m > without                 # a margin is a bar to clear: the loss can only grow
    assert not np.allclose(g1, g0)
    assert {k: v for k, v in m1.items() if k != "loss"} == pytest.approx({k: v for k, v in m0.items() if k != "loss"})


def test_batches_with_total_pairs_sum_to_the_whole_set():
  rewards, extras = loss_spec.random_rewards(np.random.default_rng(3), pairs=5, margin=True)
  for run in (run_jax, run_torch):
    full, full_m, _ = run(rewards, extras)
    parts, metrics = 0.0, dict.fromkeys(full_m, 0.0)
    for rows, pairs in ((slice(0, 4), slice(0, 2)), (slice(4, 10), slice(2, 5))):
      got, m, _ = run(rewards[rows], {"margin": extras["margin"][pairs], "total_pairs": np.float32(5)})
      parts += got
      for k in m:
        metrics[k] += m[k]
    assert parts == pytest.approx(full, rel=1e-5)
    for k in full_m:
      assert metrics[k] == pytest.approx(full_m[k], rel=1e-5, abs=1e-7), k


def test_jitted_jax_loss():
  rewards, extras = loss_spec.random_rewards(np.random.default_rng(4), pairs=3)
  loss, _ = jax.jit(jax_rm.reward_loss)(jnp.asarray(rewards), {k: jnp.asarray(v) for k, v in extras.items()})
  assert float(loss) == pytest.approx(loss_spec.reward_loss(rewards, extras)[0], rel=1e-5)


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match="B even"):
    loss_spec.reward_loss(np.zeros(3, np.float32), {})
  with pytest.raises(ValueError, match="B even"):
    torch_rm.reward_loss(torch.zeros(3), {})
  with pytest.raises(ValueError, match="B even"):
    jax_rm.reward_loss(jnp.zeros((2, 2)), {})
  with pytest.raises(ValueError, match=r"margin.*one per pair"):
    loss_spec.reward_loss(np.zeros(4, np.float32), {"margin": np.zeros(4, np.float32)})

"""The torch clipped-PG loss against the NumPy spec: values, metrics, gradients, micro-batching."""
import itertools

import numpy as np
import pytest
import torch

from dockyard.grpo import loss_spec
from dockyard.grpo.loss_spec import LossConfig
from dockyard.trainer_torch import loss as tloss


random_batch = loss_spec.random_batch


GRID = [LossConfig(ratio_clip_min=0.2, ratio_clip_max=0.28, ratio_clip_c=c, reference_policy_kl_penalty=kl,
                   use_importance_sampling_correction=isc, ratio_level=level, normalization=norm,
                   max_completion_tokens=12)
        for c, kl, isc, level, norm in itertools.product(
            (0.0, 3.0), (0.0, 0.05), (False, True), loss_spec.RATIO_LEVELS, loss_spec.NORMALIZATIONS)]


def torch_loss(lp, mask, extras, cfg):
  t = {k: torch.as_tensor(v) for k, v in extras.items()}
  lp_t = torch.tensor(lp, requires_grad=True)
  loss, metrics = tloss.clipped_pg_loss(lp_t, torch.as_tensor(mask), t, cfg)
  loss.backward()
  return float(loss.detach()), {k: float(v) for k, v in metrics.items()}, lp_t.grad.numpy()


@pytest.mark.parametrize("cfg", GRID, ids=lambda c: f"c{c.ratio_clip_c}-kl{c.reference_policy_kl_penalty}-"
                         f"is{int(c.use_importance_sampling_correction)}-{c.ratio_level}-{c.normalization}")
def test_matches_spec_values_metrics_and_gradient(cfg):
  rng = np.random.default_rng(0)
  lp, mask, extras = random_batch(rng, per_token_adv=cfg.ratio_level == "token")
  want, want_metrics = loss_spec.clipped_pg_loss(lp, mask, extras, cfg)
  got, got_metrics, grad = torch_loss(lp, mask, extras, cfg)
  assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
  assert set(got_metrics) == set(want_metrics)
  for k in want_metrics:
    assert got_metrics[k] == pytest.approx(want_metrics[k], rel=1e-5, abs=1e-6), k
  # The gradient w.r.t. logprobs against central differences of the float64 spec.
  h = 1e-4
  fd = np.zeros_like(lp, dtype=np.float64)
  for i, j in zip(*np.nonzero(mask)):
    up, down = lp.astype(np.float64), lp.astype(np.float64)
    up[i, j] += h
    down[i, j] -= h
    fd[i, j] = (loss_spec.clipped_pg_loss(up, mask, extras, cfg)[0]
                - loss_spec.clipped_pg_loss(down, mask, extras, cfg)[0]) / (2 * h)
  np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=2e-5)
  assert np.all(grad[mask == 0] == 0), "masked positions (prompt, padding) must get no gradient"
  assert np.abs(grad).sum() > 0


# Every (ratio_level, normalization) pair, with dual clip, KL and the IS correction all on.
MICRO = [c for c in GRID if c.ratio_clip_c and c.reference_policy_kl_penalty
         and c.use_importance_sampling_correction]


@pytest.mark.parametrize("cfg", MICRO, ids=lambda c: f"{c.ratio_level}-{c.normalization}")
def test_micro_batches_sum_to_the_full_batch(cfg):
  rng = np.random.default_rng(1)
  lp, mask, extras = random_batch(rng, b=6)
  full, full_metrics, full_grad = torch_loss(lp, mask, extras, cfg)
  totals = dict(total_tokens=np.float32(mask.sum()), total_sequences=np.float32((mask.sum(-1) > 0).sum()))
  parts, grads, metrics = 0.0, [], {}
  for s in (slice(0, 2), slice(2, 5), slice(5, 6)):   # uneven splits, one micro-batch without loss
    sub = {k: v[s] for k, v in extras.items()}
    loss, m, g = torch_loss(lp[s], mask[s], {**sub, **totals}, cfg)
    parts += loss
    grads.append(g)
    for k, v in m.items():
      metrics[k] = metrics.get(k, 0.0) + v
  assert parts == pytest.approx(full, rel=1e-5, abs=1e-7)
  np.testing.assert_allclose(np.concatenate(grads), full_grad, rtol=1e-5, atol=1e-8)
  for k in full_metrics:
    assert metrics[k] == pytest.approx(full_metrics[k], rel=1e-5, abs=1e-7), k


def test_absent_prev_logprobs_are_the_logprobs_detached():
  cfg = MICRO[0]
  lp, mask, extras = random_batch(np.random.default_rng(3))
  without = {k: v for k, v in extras.items() if k != "prev_logprobs"}
  got, got_m, grad = torch_loss(lp, mask, without, cfg)
  want, want_m, grad_given = torch_loss(lp, mask, {**without, "prev_logprobs": lp}, cfg)
  assert got == pytest.approx(want, rel=1e-6) and got_m == pytest.approx(want_m, rel=1e-6)
  np.testing.assert_allclose(grad, grad_given, rtol=1e-6, atol=1e-9)


def test_nll_matches_spec_and_missing_extras_are_named():
  rng = np.random.default_rng(2)
  lp, mask, extras = random_batch(rng)
  want, _ = loss_spec.nll_loss(lp, mask, {})
  got, metrics = tloss.nll_loss(torch.as_tensor(lp), torch.as_tensor(mask), {})
  assert float(got) == pytest.approx(want, rel=1e-6)
  assert float(metrics["nll"]) == pytest.approx(want, rel=1e-6)
  cfg = LossConfig(reference_policy_kl_penalty=0.1)
  with pytest.raises(KeyError, match="reference_logprobs"):
    tloss.clipped_pg_loss(torch.as_tensor(lp), torch.as_tensor(mask),
                          {k: v for k, v in extras.items() if k != "reference_logprobs"}, cfg)

"""Top-k distillation's pieces on both trainers: the top-k KL loss against its NumPy spec
(`dockyard.distill.topk_kl_loss`), by hand and on random inputs with gradients; `Policy.topk_logprobs`
(the teachers' side) on one checkpoint in both backends; and the trainers' half of the top-k
contract of `dockyard.policy` (the student's logprobs of given ids, handed to the loss)."""
import numpy as np
import pytest

import torch_common
from dockyard.distill import topk_kl_loss as spec


def _random_case(seed=0, b=3, t=6, v=11, k=4, teachers=2):
  rng = np.random.default_rng(seed)
  m = (rng.random((b, t)) < 0.7).astype(np.float32)
  m[:, 0] = 0

  def logp():
    x = rng.normal(size=(b, t, v)) * 2
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
  ids, student, teacher = [], [], []
  for _ in range(teachers):
    q = logp()
    top = np.argsort(-q, -1)[..., :k]
    ids.append(top)
    teacher.append(np.take_along_axis(q, top, -1))
  s_full = logp()
  student = np.concatenate([np.take_along_axis(s_full, i, -1) for i in ids], -1).astype(np.float32)
  extras = {"teacher_topk_logprobs": np.concatenate(teacher, -1).astype(np.float32),
            "total_tokens": np.float32(m.sum() + 3)}   # a micro-batch of a larger batch
  return student, m, extras


def test_the_spec_by_hand():
  s, q = np.log([[[0.5, 0.3]]]), np.log([[[0.6, 0.2]]])
  m = np.ones((1, 1), np.float32)
  loss, metrics = spec(s, m, {"teacher_topk_logprobs": q}, [1.0])
  # two tokens and the rest (0.2 on both sides)
  assert loss == pytest.approx(0.5 * np.log(0.5 / 0.6) + 0.3 * np.log(0.3 / 0.2), abs=1e-9)
  assert metrics["topk_student_mass"] == pytest.approx(0.8)
  assert spec(q, m, {"teacher_topk_logprobs": q}, [1.0])[0] == pytest.approx(0.0, abs=1e-9)
  # two teachers: the weighted sum of each one's KL
  both = spec(np.concatenate([s, q], -1), m, {"teacher_topk_logprobs": np.concatenate([q, s], -1)}, [0.25, 0.75])[0]
  rev = spec(q, m, {"teacher_topk_logprobs": s}, [1.0])[0]
  assert both == pytest.approx(0.25 * loss + 0.75 * rev, abs=1e-9)


@pytest.mark.parametrize("per_row", [False, True])
def test_jax_and_torch_losses_follow_the_spec_with_equal_gradients(per_row):
  """per_row: the batch carries each row's teacher weights (`teacher_weights` [B, M]: one-hot rows,
  a teacher chosen per group, and a mixed row), which replace the closed-over weights."""
  import jax
  import jax.numpy as jnp
  import torch

  from dockyard.trainer_jax import loss as jax_loss
  from dockyard.trainer_torch import loss as torch_loss
  student, m, extras = _random_case()
  weights = (0.3, 0.7)
  if per_row:
    extras["teacher_weights"] = np.array([[1, 0], [0, 1], [0.6, 0.4]], np.float32)
    rows = [spec(student[r:r + 1], m[r:r + 1], {k: v[r:r + 1] if np.ndim(v) else v for k, v in extras.items()},
                 weights)[0] for r in range(3)]
    by_hand = [spec(student[r:r + 1, :, 4 * i:4 * i + 4], m[r:r + 1],
                    {"teacher_topk_logprobs": extras["teacher_topk_logprobs"][r:r + 1, :, 4 * i:4 * i + 4],
                     "total_tokens": extras["total_tokens"]}, (1.0,))[0] for r, i in ((0, 0), (1, 1))]
    np.testing.assert_allclose(rows[:2], by_hand, rtol=1e-12)   # a one-hot row is that teacher's KL
  want, want_metrics = spec(student, m, extras, weights)
  assert want > 0
  if per_row:
    assert want == pytest.approx(sum(rows), rel=1e-12)
    assert want != pytest.approx(spec(student, m, {k: v for k, v in extras.items() if k != "teacher_weights"},
                                      weights)[0], rel=1e-3)

  jfn = jax_loss.make_topk_kl_loss(weights)
  def jloss(s):
    return jfn(jnp.zeros(m.shape), jnp.asarray(m), {**extras, "topk_logprobs": s})
  (got_j, metrics_j), grad_j = jax.value_and_grad(jloss, has_aux=True)(jnp.asarray(student))

  s_t = torch.tensor(student, requires_grad=True)
  got_t, metrics_t = torch_loss.make_topk_kl_loss(weights)(
      torch.zeros(m.shape), torch.tensor(m), {**{k: torch.as_tensor(v) for k, v in extras.items()}, "topk_logprobs": s_t})
  got_t.backward()
  for got, metrics in ((float(got_j), metrics_j), (float(got_t.detach()), metrics_t)):
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    for k, v in want_metrics.items():
      assert float(metrics[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k
  np.testing.assert_allclose(np.asarray(grad_j), s_t.grad.numpy(), rtol=1e-4, atol=1e-6)
  # the gradient is the spec's: a central difference on one entry that is in the mask
  b, t = map(int, np.argwhere(m > 0)[0])
  eps = 1e-4
  plus, minus = student.astype(np.float64), student.astype(np.float64)
  plus[b, t, 1] += eps
  minus[b, t, 1] -= eps
  numeric = (spec(plus, m, extras, weights)[0] - spec(minus, m, extras, weights)[0]) / (2 * eps)
  assert float(grad_j[b, t, 1]) == pytest.approx(numeric, rel=1e-3, abs=1e-6)


@pytest.fixture(scope="module")
def both(model_path, build_policy):
  import jax

  from dockyard.trainer_jax.policy import JaxPolicy
  cfg = torch_common.make_config(micro_batch_size=4, warmup_steps=0)
  return build_policy(micro_batch_size=4, warmup_steps=0), JaxPolicy.from_hf(model_path, cfg, devices=jax.devices()[:1])


def test_topk_logprobs_agree_across_backends_and_with_logprobs(both):
  torch_policy, jax_policy = both
  batch = torch_common.make_batch(seed=3)
  batch.temperature = 0.7
  ids_t, lp_t = torch_policy.topk_logprobs(batch, 5)
  ids_j, lp_j = jax_policy.topk_logprobs(batch, 5)
  assert ids_t.shape == lp_t.shape == (batch.batch_size, batch.input_ids.shape[1], 5)
  np.testing.assert_allclose(lp_t, lp_j, rtol=0, atol=1e-4)
  assert (ids_t == ids_j).mean() > 0.99        # ties aside
  real = batch.attention_mask.astype(bool)
  real[:, 0] = False
  assert np.all(np.diff(lp_j[real], axis=-1) <= 0)   # most likely first
  assert np.all(lp_j[~real] == 0) and np.all(ids_j[~real] == 0)
  # the top-1 token's logprob is what `logprobs` reports for that token in that place (each row's
  # last token: replacing it changes no other position's context)
  last = batch.attention_mask.sum(1) - 1
  rows = np.arange(batch.batch_size)
  forced_ids = batch.input_ids.copy()
  forced_ids[rows, last] = ids_j[rows, last, 0]
  forced = type(batch)(forced_ids, batch.attention_mask, batch.loss_mask, {}, batch.temperature)
  np.testing.assert_allclose(jax_policy.logprobs(forced)[rows, last], lp_j[rows, last, 0], atol=1e-5)


def test_the_trainers_hand_the_loss_the_logprobs_of_the_given_ids(both):
  """topk_ids whose first column is the batch's own tokens: the trainer's `topk_logprobs`[..., 0]
  must equal the `logprobs` it hands the same loss, on both backends."""
  import jax.numpy as jnp
  import torch
  torch_policy, jax_policy = both
  batch = torch_common.make_batch(seed=4)
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 512, size=batch.input_ids.shape + (3,)).astype(np.int32)
  ids[..., 0] = batch.input_ids
  batch.extras = {"topk_ids": ids}

  def probe(np_like):
    def loss_fn(logprobs, loss_mask, extras):
      gap = np_like.abs(extras["topk_logprobs"][..., 0] - logprobs) * loss_mask
      return 0.0 * logprobs.sum(), {"gap": gap.sum(), "sum": (extras["topk_logprobs"][..., 1] * loss_mask).sum()}
    return loss_fn
  m_j = jax_policy.train_step(batch, probe(jnp))
  m_t = torch_policy.train_step(batch, probe(torch))
  assert m_j["gap"] < 1e-4 and m_t["gap"] < 1e-4, (m_j["gap"], m_t["gap"])
  assert m_j["sum"] == pytest.approx(m_t["sum"], rel=1e-4) and m_j["sum"] < -1.0

"""Sequence packing and token-budget micro-batches in the torch trainer: packed == unpacked and
dynamic == fixed (logprobs, loss, metrics, gradients), fp32 to 1e-5, for the GRPO loss and the SFT
NLL. Packed rows reach transformers as restarting `position_ids` with no attention mask (its
block-causal mask for sdpa/eager); a cross-segment leak would show here as a logprob error."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch_common

from dockyard import packing
from dockyard.grpo.loss_spec import LossConfig
from dockyard.policy import TrainBatch
from dockyard.trainer_torch.loss import make_pg_loss, nll_loss

PG = make_pg_loss(LossConfig(normalization="sequence", reference_policy_kl_penalty=0.1))


@pytest.fixture(scope="module")
def build(model_path):
  torch.set_num_threads(1)
  from dockyard.trainer_torch.policy import TorchPolicy

  def make(packing_row_tokens=0, micro_batch_tokens=0, micro_batch_size=16):
    cfg = torch_common.make_config(micro_batch_size=micro_batch_size, warmup_steps=0, lr=1.0)
    # eps 1, no decay or clipping: Adam's first update is g / (|g| + 1), so the parameters after
    # one step compare the gradients themselves.
    cfg.optim.update(eps=1.0, weight_decay=0.0, max_grad_norm=1e9, micro_batch_tokens=micro_batch_tokens)
    cfg.policy.packing_row_tokens = packing_row_tokens
    return TorchPolicy.from_hf(model_path, cfg)
  return make


def _batch(seed=0, b=9, t=40):
  batch = torch_common.make_batch(seed=seed, b=b, t=t)
  return batch


def _with_extras(batch, lp, seed=0):
  rng = np.random.default_rng(seed)
  noise = lambda: (0.2 * rng.standard_normal(lp.shape)).astype(np.float32) * batch.attention_mask
  return TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask, dict(
      batch.extras, prev_logprobs=lp + noise(), generation_logprobs=lp + noise(),
      reference_logprobs=lp + noise()), batch.temperature)


def _params(policy):
  return {k: v.detach().full_tensor().clone() if hasattr(v, "full_tensor") else v.detach().clone()
          for k, v in policy.model.named_parameters()}


def _assert_same_step(a, b, pa, pb):
  for key in a:
    if key != "lr":
      assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (key, a[key], b[key])
  for name in pa:
    torch.testing.assert_close(pa[name], pb[name], atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("loss", ["grpo", "nll"])
def test_packed_and_token_budget_equal_unpacked(build, loss):
  plain = build()
  packed = build(packing_row_tokens=48, micro_batch_size=2)        # 2 rows of <= 48 tokens a micro-batch
  budget = build(micro_batch_tokens=80)                            # unpacked, <= 80 padded tokens
  batch = _batch(seed=3)
  lengths = packing.seq_lengths(batch)
  plan = packing.pack_micro_batches(batch, 48, 2, trim=True)
  assert len(plan) >= 2 and max(m.segment_ids.max() for m in plan) >= 2, "rows hold 2+ sequences"
  assert len(packing.token_budget_groups(lengths, 80)) >= 3

  lp = plain.logprobs(batch)
  for other in (packed, budget):
    got = other.logprobs(batch)
    np.testing.assert_allclose(got, lp, atol=1e-5, rtol=0)
  if loss == "grpo":
    batch, fn = _with_extras(batch, lp), PG
  else:
    fn = nll_loss
  a = plain.train_step(batch, fn)
  assert a["grad_norm"] > 0
  pa = _params(plain)
  for other in (packed, budget):
    _assert_same_step(a, other.train_step(batch, fn), pa, _params(other))


def test_both_budgets_set_is_refused(build):
  with pytest.raises(ValueError, match="packing_row_tokens.*micro_batch_tokens"):
    build(packing_row_tokens=64, micro_batch_tokens=64)


def test_two_ranks_packed_match_one_process_unpacked(model_path, build_policy, tmp_path):
  """torchrun, 2 ranks, packed rows of 28 tokens (5 a step), one row a micro-batch: the global plan's
  micro-batches alternate over the ranks (an odd count gives one rank an empty dummy micro-batch);
  4 steps equal the one-process unpacked trainer's (loss, grad norm, weights)."""
  here = os.path.dirname(os.path.abspath(__file__))
  root = os.path.dirname(os.path.dirname(here))
  cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         os.path.join(here, "dist_worker.py"), model_path, str(tmp_path), "--micro_batch_size=1",
         "--packing_row_tokens=28"]
  proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root},
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  plans = [len(packing.pack_micro_batches(torch_common.make_batch(seed=s), 28, 1)) for s in range(4)]
  assert any(n % 2 for n in plans) and min(n for n in plans) >= 3, plans
  data = np.load(os.path.join(str(tmp_path), "result.npz"))
  policy = build_policy(micro_batch_size=2)
  loss_fn = make_pg_loss(torch_common.loss_config(policy.config))
  for step in range(4):
    batch = torch_common.make_batch(seed=step)
    batch = torch_common.with_prev(batch, policy.logprobs(batch), seed=100 + step)
    m = policy.train_step(batch, loss_fn)
    assert abs(m["loss"] - float(data["loss"][step])) <= 1e-5, (step, m["loss"], data["loss"][step])
    assert abs(m["grad_norm"] - float(data["grad_norm"][step])) <= 1e-5 * max(1.0, m["grad_norm"])
  for name, w in policy.named_weights():
    np.testing.assert_allclose(data["w/" + name], w, rtol=0, atol=1e-5, err_msg=name)

"""Real multi-process training: `torchrun --nproc_per_node=2` on gloo (see conftest `torchrun_runs`).

Checks that parameters really are sharded over the two ranks, that two ranks train like one
process (loss + updated weights), and that a DCP checkpoint resumes exactly in fresh processes
(4 steps == 2 steps + save + restore + 2 steps), also into a different world size (1 rank).
"""
import json
import os

import numpy as np
import pytest

import torch_common
from dockyard.trainer_torch.loss import make_pg_loss


def load(out):
  data = np.load(os.path.join(out, "result.npz"))
  weights = {k[2:]: data[k] for k in data.files if k.startswith("w/")}
  return data, weights


def train_in_process(policy, steps):
  loss_fn = make_pg_loss(torch_common.loss_config(policy.config))
  losses, norms = [], []
  for step in steps:
    batch = torch_common.make_batch(seed=step)
    batch = torch_common.with_prev(batch, policy.logprobs(batch), seed=100 + step)
    m = policy.train_step(batch, loss_fn)
    losses.append(m["loss"])
    norms.append(m["grad_norm"])
  return losses, norms, dict(policy.named_weights())


def test_parameters_are_sharded_across_the_two_ranks(torchrun_runs):
  a, _ = torchrun_runs
  ranks = [json.load(open(os.path.join(a, f"shards_rank{r}.json"))) for r in (0, 1)]
  assert [r["world"] for r in ranks] == [2, 2]
  emb = [r["shards"]["model.embed_tokens.weight"] for r in ranks]
  assert emb[0]["full"] == [512, 64] and emb[0]["local"] == emb[1]["local"] == [256, 64]
  for name, info in ranks[0]["shards"].items():
    assert info["placements"] == "(Shard(dim=0),)", name
    local = info["local"][0] + ranks[1]["shards"][name]["local"][0]
    assert local == info["full"][0], f"{name}: the two shards do not add up to the full dim 0"
    assert info["local"][0] < info["full"][0], f"{name} is not split"


def test_two_ranks_match_one_process(torchrun_runs, build_policy):
  a, _ = torchrun_runs
  data, weights = load(a)
  losses, norms, single = train_in_process(build_policy(micro_batch_size=2), range(4))
  np.testing.assert_allclose(data["loss"], losses, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(data["grad_norm"], norms, rtol=1e-5)
  assert sorted(weights) == sorted(single)
  print("2 ranks vs 1 process: max |loss diff|", np.abs(data["loss"] - losses).max(),
        "max |w diff|", max(float(np.abs(weights[n] - single[n]).max()) for n in single))
  for name in single:
    np.testing.assert_allclose(weights[name], single[name], rtol=0, atol=1e-5, err_msg=name)


def test_resume_in_fresh_processes_is_exact(torchrun_runs):
  a, b = torchrun_runs
  full, w_full = load(a)
  resumed, w_resumed = load(b)
  assert int(full["step"]) == int(resumed["step"]) == 4
  print("resume: max |w diff|", max(float(np.abs(w_resumed[n] - w_full[n]).max()) for n in w_full))
  np.testing.assert_array_equal(resumed["loss"], full["loss"][2:])
  for name in w_full:
    np.testing.assert_allclose(w_resumed[name], w_full[name], rtol=0, atol=1e-6, err_msg=name)


def test_two_rank_checkpoint_restores_into_one_rank(torchrun_runs, build_policy):
  """DCP reshards on load: the 2-rank checkpoint continues in this one-rank process."""
  a, _ = torchrun_runs
  full, w_full = load(a)
  policy = build_policy(micro_batch_size=2)
  policy.restore(os.path.join(a, "ckpt"))
  assert policy.step == 2
  losses, _, weights = train_in_process(policy, range(2, 4))
  np.testing.assert_allclose(losses, full["loss"][2:], rtol=1e-5, atol=1e-6)
  for name in w_full:
    np.testing.assert_allclose(weights[name], w_full[name], rtol=0, atol=1e-5, err_msg=name)


def test_restore_names_a_missing_checkpoint(build_policy, tmp_path):
  with pytest.raises(FileNotFoundError, match="no checkpoint"):
    build_policy().restore(str(tmp_path))

"""Checkpoints: kill-and-resume equals an uninterrupted run bit for bit; best-k retention; data state."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from dockyard.trainer_jax import data as data_lib
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.checkpoint import Checkpointer
from dockyard.trainer_jax.policy import JaxPolicy

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _sft(model, data, workdir, dump, **kw):
  cmd = [sys.executable, "-m", "dockyard.trainer_jax.sft", f"--model={model}", f"--data={data}",
         f"--workdir={workdir}", "--steps=6", "--batch_size=4", "--seq_len=32", "--save_every=3", f"--dump={dump}",
         f"--config={ROOT}/configs/swe.py"] + [f"--{k}={v}" for k, v in kw.items()]
  # One CPU device in the children: cheaper, and the comparison is about resuming, not sharding.
  env = {**os.environ, "PYTHONPATH": ROOT, "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
         "JAX_PLATFORMS": "cpu"}
  return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait(proc):
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, out[-3000:]
  return out


def test_kill_and_resume_equals_uninterrupted(tiny_models, tmp_path):
  data = tmp_path / "data.jsonl"
  with open(data, "w") as f:
    for a in range(30):
      f.write(json.dumps({"prompt": f"{a} + {a + 7} = ", "answer": f"{2 * a + 7}."}) + "\n")
  model = tiny_models["qwen2"]
  # The uninterrupted run and the first half of the interrupted one run side by side.
  full = _sft(model, data, tmp_path / "full", tmp_path / "full.npz")
  first = _sft(model, data, tmp_path / "resumed", tmp_path / "unused.npz", stop_after=3)
  out_first = _wait(first)
  assert '"step": 3' in out_first and '"step": 4' not in out_first
  assert not os.path.exists(tmp_path / "unused.npz")  # it exited before finishing
  second = _sft(model, data, tmp_path / "resumed", tmp_path / "resumed.npz")
  out_full, out_second = _wait(full), _wait(second)
  assert "resumed from step 3" in out_second
  a, b = np.load(tmp_path / "full.npz"), np.load(tmp_path / "resumed.npz")
  assert int(a["step"]) == int(b["step"]) == 6
  assert sorted(a.files) == sorted(b.files)
  for name in a.files:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  # Steps 4..6 of both runs logged the same losses (same batches from the restored grain state).
  def losses(out):
    return [json.loads(line)["loss"] for line in out.splitlines() if line.startswith('{"step"')]
  assert losses(out_full)[3:] == losses(out_second)
  assert len(set(losses(out_full))) > 1


def _tiny_policy(path, config):
  mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  return JaxPolicy.from_hf(path, config, mesh=mesh)


def test_keeps_the_latest(tiny_models, config, tmp_path):
  # (the best by a validation metric is the GRPO loop's: dockyard.grpo.checkpoints.BestK)
  policy = _tiny_policy(tiny_models["qwen2"], config)
  ckpt = Checkpointer(str(tmp_path / "c"), keep_latest=2)
  for step in range(1, 5):
    ckpt.save(step, policy.model, policy.optimizer, extra={"tag": step * 10})
  assert ckpt.all_steps() == [3, 4] and ckpt.latest_step() == 4
  assert ckpt.restore(policy.model, policy.optimizer, step=3) == {"step": 3, "tag": 30}
  with pytest.raises(ValueError, match="keep_latest"):
    Checkpointer(str(tmp_path / "d"), keep_latest=0)


def test_restore_brings_back_weights_and_optimizer(tiny_models, config, tmp_path):
  from dockyard.policy import TrainBatch
  from dockyard.trainer_jax.loss import nll_loss
  policy = _tiny_policy(tiny_models["llama"], config)
  ids = np.random.default_rng(0).integers(0, 1024, (8, 20)).astype(np.int32)
  batch = TrainBatch(ids, np.ones_like(ids), np.ones_like(ids))
  policy.train_step(batch, nll_loss)
  # The policy's step numbers the checkpoint.
  policy.save(str(tmp_path))
  assert policy.checkpointer(str(tmp_path)).all_steps() == [1]
  saved = dict(policy.named_weights())
  after_save = policy.train_step(batch, nll_loss)
  after_save_weights = dict(policy.named_weights())
  policy.train_step(batch, nll_loss)
  assert policy.step == 3
  policy.restore(str(tmp_path))
  assert policy.step == 1
  for name, arr in policy.named_weights():
    np.testing.assert_array_equal(arr, saved[name], err_msg=name)
  # The Adam moments and step came back too: the next step repeats the first post-save step.
  assert policy.train_step(batch, nll_loss) == after_save
  for name, arr in policy.named_weights():
    np.testing.assert_array_equal(arr, after_save_weights[name], err_msg=name)


def test_grain_pipeline_shards_shuffles_and_resumes():
  records = [{"x": np.int32(i)} for i in range(20)]
  a = data_lib.pipeline(records, 3, seed=1, shard_index=0, shard_count=2)
  b = data_lib.pipeline(records, 3, seed=1, shard_index=1, shard_count=2)
  ia, ib = iter(a), iter(b)
  first_epoch_a = np.concatenate([next(ia)["x"] for _ in range(3)])
  first_epoch_b = np.concatenate([next(ib)["x"] for _ in range(3)])
  assert set(first_epoch_a) <= set(range(0, 20, 2)) and set(first_epoch_b) <= set(range(1, 20, 2))
  assert list(first_epoch_a) != sorted(first_epoch_a)  # shuffled
  same = iter(data_lib.pipeline(records, 3, seed=1, shard_index=0, shard_count=2))
  np.testing.assert_array_equal(np.concatenate([next(same)["x"] for _ in range(3)]), first_epoch_a)
  state = ia.get_state()
  upcoming = [next(ia)["x"] for _ in range(5)]  # crosses into the next (re-shuffled) epoch
  fresh = iter(data_lib.pipeline(records, 3, seed=1, shard_index=0, shard_count=2))
  fresh.set_state(state)
  for want in upcoming:
    np.testing.assert_array_equal(next(fresh)["x"], want)
  # Ragged prompt records batch as lists (batch_fn=list) instead of being stacked.
  prompts = [{"prompt": "x" * i, "ids": list(range(i))} for i in range(1, 8)]
  got = next(iter(data_lib.pipeline(prompts, 3, seed=0, shard_index=0, shard_count=1, batch_fn=list)))
  assert isinstance(got, list) and len(got) == 3 and len({len(r["ids"]) for r in got}) == 3
  with pytest.raises(ValueError, match="shard_index 2"):
    data_lib.pipeline(records, 3, shard_index=2, shard_count=2)
  with pytest.raises(ValueError, match="fewer than one batch"):
    data_lib.pipeline(records[:2], 3, shard_index=0, shard_count=1)

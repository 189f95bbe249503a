"""NNX decoder vs transformers: same logits (fp32, <= 1e-4), and load -> save_hf -> reload is exact."""
import json
import os

import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from dockyard.trainer_jax import hf_io

TOL = 1e-4


def _torch_logits(path, ids, mask=None):
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  with torch.no_grad():
    kw = {} if mask is None else {"attention_mask": torch.tensor(mask)}
    return model(torch.tensor(ids), **kw).logits.numpy(), model


def _ids(vocab, shape, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


@nnx.jit
def _forward(model, ids, mask):
  return model(ids, mask)


def _check_parity(path, t=40):
  model = hf_io.from_hf(path)
  ids = _ids(model.config.vocab_size, (2, t))
  ours = np.asarray(_forward(model, ids, np.ones_like(ids)))
  theirs, torch_model = _torch_logits(path, ids)
  diff = np.abs(ours - theirs).max()
  assert diff <= TOL, f"max |logits diff| {diff} > {TOL} for {path}"
  return model, torch_model, ours


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_logits_match_transformers(tiny_models, family):
  _check_parity(tiny_models[family])


def test_llama_with_biases_and_llama3_rope(llama_variant):
  model, _, ours = _check_parity(llama_variant, t=96)
  cfg = model.config
  assert cfg.o_bias and cfg.mlp_bias and cfg.rope_type == "llama3"
  # The scaling really is applied: unscaled frequencies give different logits.
  import dataclasses
  plain = np.asarray(cfg.__class__(**{**dataclasses.asdict(cfg), "rope_type": "default"}).inv_freq())
  assert not np.allclose(plain, cfg.inv_freq())


def test_qwen2_linear_rope(qwen2_linear_rope, tiny_models):
  _, _, scaled = _check_parity(qwen2_linear_rope)
  _, _, plain = _check_parity(tiny_models["qwen2"])
  assert np.abs(scaled - plain).max() > 1e-3  # the factor changed the model


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_save_hf_round_trip_is_bit_identical(tiny_models, family, tmp_path):
  src = tiny_models[family]
  model = hf_io.from_hf(src)
  hf_io.save_hf(model, str(tmp_path), src)
  original = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).state_dict()
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).state_dict()
  assert set(original) == set(reloaded)
  for name, tensor in original.items():
    assert torch.equal(tensor, reloaded[name]), name
  # Sharded output (index + several files) loads back through both readers, still exact.
  sharded = tmp_path / "sharded"
  hf_io.save_hf(model, str(sharded), src, max_shard_bytes=200_000)
  with open(sharded / hf_io.INDEX) as f:
    files = set(json.load(f)["weight_map"].values())
  assert len(files) > 1 and not os.path.exists(sharded / hf_io.SINGLE)
  again = hf_io.from_hf(str(sharded))
  for name, arr in hf_io.named_params(model).items():
    np.testing.assert_array_equal(np.asarray(arr), np.asarray(hf_io.named_params(again)[name]), name)
  via_torch = transformers.AutoModelForCausalLM.from_pretrained(str(sharded), dtype=torch.float32).state_dict()
  for name, tensor in original.items():
    assert torch.equal(tensor, via_torch[name]), name


def test_logprobs_ignore_right_padding(tiny_models):
  """Padding after a sequence must not change its tokens' logprobs (checked against torch too)."""
  from dockyard.trainer_jax.train import logprob_step
  model = hf_io.from_hf(tiny_models["qwen2"])
  ids = _ids(model.config.vocab_size, (3, 24), seed=3)
  garbage = _ids(model.config.vocab_size, (3, 24), seed=4)
  mask = np.ones_like(ids)
  lengths = [24, 13, 5]
  for i, n in enumerate(lengths):
    ids[i, n:] = 0
    garbage[i, :n] = ids[i, :n]
    mask[i, n:] = 0
  batched = np.asarray(logprob_step(model, ids, mask))
  assert np.all(batched[:, 0] == 0)
  # Whatever sits in the padding, the real tokens' logprobs are the same.
  other = np.asarray(logprob_step(model, garbage, mask))
  for i, n in enumerate(lengths):
    np.testing.assert_allclose(other[i, :n], batched[i, :n], atol=1e-6)
  # And the shortest row alone, unpadded, agrees with its padded self.
  alone = np.asarray(logprob_step(model, ids[2:, :5], mask[2:, :5]))[0]
  np.testing.assert_allclose(batched[2, :5], alone, atol=1e-5)
  logits, _ = _torch_logits(tiny_models["qwen2"], ids, mask)
  ref = torch.log_softmax(torch.tensor(logits[:, :-1]), -1).gather(-1, torch.tensor(ids[:, 1:, None]).long())[..., 0]
  for i, n in enumerate(lengths):
    np.testing.assert_allclose(batched[i, 1:n], ref[i, :n - 1].numpy(), atol=TOL)


def test_bad_checkpoint_directory_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf_io.from_hf(str(tmp_path))

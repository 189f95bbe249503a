"""Gemma 3 (text, `model_type: gemma3_text`) in the NNX decoder: logprobs equal transformers'
Gemma3ForCausalLM (fp32, right-padded rows longer than the sliding window, so the window decides
the result), the window is exactly transformers' (W keys, the query's own included), packed rows
score as unpacked ones, save_hf round-trips bit for bit, and what is not implemented is refused
naming the config.json key."""
import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from dockyard.models import name_map
from dockyard.models.model_config import ModelConfig
from dockyard.trainer_jax import hf_io
from dockyard.trainer_jax.model import segment_attention, token_logprobs

TOL = 1e-4
WINDOW = 16
LENGTHS = (40, 33, 21, 7)   # right padding, rows longer and shorter than the window


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
  """A tiny Gemma 3: 4 layers (0, 2 slide over 16 keys; 1, 3 full attention with linear RoPE
  scaling x4), untied head, every norm weight perturbed (they initialise to 0, where a missing
  (1 + w) or a swapped norm would not show)."""
  from dockyard.models.tiny import make_hf_config
  cfg = make_hf_config({"family": "gemma3", "num_hidden_layers": 4, "tie_word_embeddings": False,
                        "sliding_window": WINDOW})
  cfg.rope_parameters["full_attention"].update(rope_type="linear", factor=4.0)
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
  assert type(model).__name__ == "Gemma3ForCausalLM"
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.normal_(0.0, 0.5)
      elif name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
        p.mul_(5.0)   # logits of a few units, not ~0: logprobs far from uniform
  path = str(tmp_path_factory.mktemp("gemma3"))
  model.save_pretrained(path)
  return path


def _with_config(src, dst, **edits):
  """A copy of an HF directory with config.json keys edited."""
  os.makedirs(dst, exist_ok=True)
  shutil.copy(os.path.join(src, "model.safetensors"), dst)
  with open(os.path.join(src, "config.json")) as f:
    cfg = json.load(f)
  cfg.update(edits)
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(cfg, f)
  return dst


def _batch(vocab, t=40, seed=0):
  ids = np.random.default_rng(seed).integers(3, vocab, (len(LENGTHS), t)).astype(np.int32)
  mask = np.zeros_like(ids)
  for i, n in enumerate(LENGTHS):
    mask[i, :n] = 1
    ids[i, n:] = 0
  return ids, mask


@nnx.jit
def _logprobs(model, ids, mask):
  return token_logprobs(model(ids, mask), ids)


def _hf_logprobs(path, ids, mask):
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  with torch.no_grad():
    logits = model(torch.tensor(ids).long(), attention_mask=torch.tensor(mask)).logits
  lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, torch.tensor(ids[:, 1:, None]).long())[..., 0]
  return np.concatenate([np.zeros((len(ids), 1), np.float32), lp.numpy()], axis=1)


def _real(mask):
  out = mask.astype(bool)
  out[:, 0] = False   # entry 0 has no logprob
  return out


def test_config_reads_gemma3s_pieces(gemma3):
  c = ModelConfig.from_pretrained(gemma3)
  assert c.family == "gemma3" and c.hidden_act == "gelu_pytorch_tanh"
  assert c.norm_plus_one and c.sandwich_norms and c.embed_scale and c.qk_norm
  assert (c.sliding_window, c.sliding_layers) == (WINDOW, (0, 2))
  assert (c.rope_type, c.rope_factor, c.rope_theta, c.rope_local_theta) == ("linear", 4.0, 1e6, 1e4)
  assert c.attn_scale == 64 ** -0.5 and c.head_dim == 32
  # transformers 4's config.json spelling of the same model reads the same.
  legacy = {k: v for k, v in json.load(open(os.path.join(gemma3, "config.json"))).items()
            if k not in ("rope_parameters", "layer_types")}
  legacy.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=2,
                rope_scaling={"rope_type": "linear", "factor": 4.0})
  assert ModelConfig.from_hf_config(legacy) == c


def test_logprobs_match_transformers_and_the_window_matters(gemma3, tmp_path):
  model = hf_io.from_hf(gemma3)
  ids, mask = _batch(model.config.vocab_size)
  ours = np.asarray(_logprobs(model, ids, mask))
  theirs = _hf_logprobs(gemma3, ids, mask)
  real = _real(mask)
  diff = np.abs(ours - theirs)[real].max()
  print(f"max |logprob jax - transformers| = {diff:.2e}")
  assert diff <= TOL, f"max |logprob diff| {diff} > {TOL}"
  assert np.abs(theirs[real]).mean() > 1.0   # not a flat distribution

  # The window decides the result: one key more (an off-by-one) or no window at all moves the
  # logprobs of the rows longer than the window far beyond the tolerance, and not the others.
  def windowed(w):   # the same weights, the sliding layers' window set to w (0: none)
    graphdef, _ = nnx.split(hf_io.abstract_decoder(dataclasses.replace(model.config, sliding_window=w)))
    other = nnx.merge(graphdef, nnx.state(model))
    return np.asarray(_logprobs(other, ids, mask))
  for w in (WINDOW + 1, 0):
    moved = np.abs(windowed(w) - ours)
    print(f"sliding_window {w} instead of {WINDOW}: max |logprob change| = {moved[real].max():.2e}")
    assert moved[0][real[0]].max() > 100 * TOL, w
    np.testing.assert_array_equal(moved[3][mask[3] > 0], 0)   # a row of 7 tokens never reaches the window
  # transformers with the window off agrees with ours with the window off.
  off = _with_config(gemma3, str(tmp_path / "nowindow"), sliding_window=4096)
  assert np.abs(np.asarray(_logprobs(hf_io.from_hf(off), ids, mask)) - _hf_logprobs(off, ids, mask))[real].max() <= TOL


def test_packed_rows_score_as_unpacked(gemma3, config):
  """Sliding windows inside packed rows: the full-mask path (rows of 128) and the banded path
  (rows of 512) give each sequence the logprobs of its own right-padded row."""
  from dockyard.policy import TrainBatch
  from dockyard.trainer_jax import sharding as shd
  from dockyard.trainer_jax.policy import JaxPolicy
  mesh = shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])

  def policy(row):
    cfg = config.copy_and_resolve_references()
    cfg.optim.micro_batch_size = 2
    cfg.policy.packing_row_tokens = row
    cfg.policy.seq_bucket = 16
    return JaxPolicy.from_hf(gemma3, cfg, mesh=mesh)
  ids, mask = _batch(1024, seed=1)
  ids, mask = np.concatenate([ids, ids[::-1]]), np.concatenate([mask, mask[::-1]])
  batch = TrainBatch(ids, mask, mask.astype(np.float32))
  plain = policy(0).logprobs(batch)
  for row in (128, 512):
    np.testing.assert_allclose(policy(row).logprobs(batch), plain, atol=1e-5, rtol=0, err_msg=f"row {row}")


def test_segment_attention_window_is_transformers_window():
  """Both paths of `segment_attention` with a sliding window equal an explicit mask built with
  transformers' rule (same segment, causal, kv_idx > q_idx - W)."""
  rng = np.random.default_rng(0)
  b, l, h, kh, d, w = 2, 512, 4, 2, 16, 24
  q, k, v = (jnp.asarray(rng.standard_normal((b, l, n, d)), np.float32) for n in (h, kh, kh))
  seg = np.zeros((b, l), np.int32)
  for r in range(b):
    col, s = 0, 1
    while col < l - 40:
      n = min(int(rng.integers(20, 160)), l - col)
      seg[r, col:col + n], col, s = s, col + n, s + 1
  i, j = np.arange(l)[:, None], np.arange(l)[None, :]
  mask = (seg[:, :, None] == seg[:, None, :]) & (j <= i) & (j > i - w)
  ref = jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask[:, None]), scale=0.3)
  for bound in (None, 160):   # the full-mask path, the banded one
    out = segment_attention(q, k, v, jnp.asarray(seg), bound, scale=0.3, sliding_window=w)
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=0, err_msg=f"segment bound {bound}")
  assert float(jnp.abs(segment_attention(q, k, v, jnp.asarray(seg), None, scale=0.3) - ref).max()) > 1e-2


def test_save_hf_round_trip_is_bit_identical(gemma3, tmp_path):
  model = hf_io.from_hf(gemma3)
  on_disk = hf_io.read_safetensors(gemma3)
  named = list(name_map.to_hf(hf_io.named_params(model), model.config))
  assert sorted(n for n, _ in named) == sorted(on_disk)
  assert "model.layers.3.post_feedforward_layernorm.weight" in on_disk
  for hf, arr in named:
    np.testing.assert_array_equal(arr, on_disk[hf], err_msg=hf)
  hf_io.save_hf(model, str(tmp_path), gemma3)
  original = transformers.AutoModelForCausalLM.from_pretrained(gemma3, dtype=torch.float32).state_dict()
  again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).state_dict()
  assert set(original) == set(again)
  for name, tensor in original.items():
    assert torch.equal(tensor, again[name]), name
  with pytest.raises(KeyError, match="lacks"):
    name_map.from_hf({k: v for k, v in on_disk.items() if "pre_feedforward" not in k}, model.config)


BASE = dict(model_type="gemma3_text", vocab_size=64, hidden_size=32, intermediate_size=48,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            sliding_window=4, layer_types=["sliding_attention", "full_attention"])


@pytest.mark.parametrize("edit,key", [
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    (dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (dict(hidden_activation="gelu"), "hidden_activation"),
    (dict(sliding_window=None), "sliding_window"),
    (dict(layer_types=["sliding_attention", "chunked_attention"]), "layer_types"),
    (dict(layer_types=["full_attention"]), "layer_types"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0}}),
     "rope_parameters.full_attention.rope_type"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "rope_scaling.rope_type"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default"},
                           "sliding_attention": {"rope_type": "linear", "factor": 2.0}}),
     "rope_parameters.sliding_attention.rope_type"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6}), "rope_parameters"),
])
def test_unimplemented_gemma3_configs_name_the_key(edit, key):
  assert ModelConfig.from_hf_config(BASE).sliding_layers == (0,)
  with pytest.raises(ValueError, match=f"config.json {key}"):
    ModelConfig.from_hf_config({**BASE, **edit})

"""The refit name-map: tables per family, round trips, and loud errors for mismatched weights."""
import numpy as np
import pytest

from dockyard.models import name_map
from dockyard.models.model_config import ModelConfig

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6)


def _cfg(model_type, **kw):
  return ModelConfig.from_hf_config({"model_type": model_type, **BASE, **kw})


def _hf_state(c, rng):
  """A random HF state dict with the shapes transformers uses."""
  e, d, f = c.hidden_size, c.head_dim, c.intermediate_size
  q, kv = c.num_heads * d, c.num_kv_heads * d
  shapes = {"q_proj.weight": (q, e), "k_proj.weight": (kv, e), "v_proj.weight": (kv, e),
            "o_proj.weight": (e, q), "q_proj.bias": (q,), "k_proj.bias": (kv,), "v_proj.bias": (kv,),
            "o_proj.bias": (e,), "q_norm.weight": (d,), "k_norm.weight": (d,),
            "gate_proj.weight": (f, e), "up_proj.weight": (f, e), "down_proj.weight": (e, f),
            "gate_proj.bias": (f,), "up_proj.bias": (f,), "down_proj.bias": (e,),
            "layernorm.weight": (e,), "embed_tokens.weight": (c.vocab_size, e),
            "norm.weight": (e,), "lm_head.weight": (c.vocab_size, e)}
  out = {}
  for entry in name_map.table(c):
    suffix = next(s for s in shapes if entry.hf.endswith(s))
    out[entry.hf] = rng.standard_normal(shapes[suffix]).astype(np.float32)
  return out


@pytest.mark.parametrize("model_type,kw,expect,absent", [
    ("qwen2", dict(tie_word_embeddings=True), ["self_attn.q_proj.bias"], ["lm_head.weight", "q_norm", "o_proj.bias"]),
    ("qwen3", dict(tie_word_embeddings=True), ["self_attn.q_norm.weight"], ["q_proj.bias", "lm_head.weight"]),
    ("llama", dict(), ["lm_head.weight"], ["bias", "q_norm"]),
    ("llama", dict(attention_bias=True, mlp_bias=True), ["o_proj.bias", "mlp.down_proj.bias"], ["q_norm"]),
])
def test_table_per_family(model_type, kw, expect, absent):
  names = [e.hf for e in name_map.table(_cfg(model_type, **kw))]
  assert len(names) == len(set(names))
  for piece in expect:
    assert any(piece in n for n in names), piece
  for piece in absent:
    assert not any(piece in n for n in names), piece


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "llama"])
def test_round_trip_is_exact_and_in_hf_order(model_type):
  c = _cfg(model_type, attention_bias=True)
  hf = _hf_state(c, np.random.default_rng(0))
  nnx_arrays = name_map.from_hf(hf, c)
  q = nnx_arrays["layers.0.attn.q_proj.kernel"]
  assert q.shape == (c.hidden_size, c.num_heads, c.head_dim)
  # Head h of the NNX kernel is rows h*D:(h+1)*D of the HF weight, transposed.
  np.testing.assert_array_equal(q[:, 1, :], hf["model.layers.0.self_attn.q_proj.weight"][c.head_dim:2 * c.head_dim].T)
  back = list(name_map.to_hf(nnx_arrays, c))
  assert [n for n, _ in back] == [e.hf for e in name_map.table(c)]
  for name, arr in back:
    assert arr.flags["C_CONTIGUOUS"], name
    np.testing.assert_array_equal(arr, hf[name])


def test_missing_and_unknown_names_are_errors():
  c = _cfg("qwen2")
  hf = _hf_state(c, np.random.default_rng(0))
  broken = dict(hf)
  del broken["model.layers.1.mlp.up_proj.weight"]
  with pytest.raises(KeyError, match="up_proj"):
    name_map.from_hf(broken, c)
  with pytest.raises(KeyError, match="does not use"):
    name_map.from_hf({**hf, "model.layers.9.mlp.up_proj.weight": np.zeros(1)}, c)
  nnx_arrays = name_map.from_hf(hf, c)
  with pytest.raises(KeyError, match="no HF name"):
    list(name_map.to_hf({**nnx_arrays, "layers.0.bogus": np.zeros(1)}, c))
  nnx_arrays.pop("final_norm.scale")
  with pytest.raises(KeyError, match="final_norm.scale"):
    list(name_map.to_hf(nnx_arrays, c))


def test_unsupported_configs_name_the_key():
  with pytest.raises(ValueError, match="model_type='gpt2'"):
    ModelConfig.from_hf_config({"model_type": "gpt2", **BASE})
  with pytest.raises(ValueError, match="yarn"):
    _cfg("qwen2", rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0})
  with pytest.raises(ValueError, match="use_sliding_window"):
    _cfg("qwen2", use_sliding_window=True)

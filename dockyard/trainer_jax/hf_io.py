"""HF checkpoint directories <-> the NNX decoder, through `dockyard.models.name_map`.

`from_hf(path, mesh, rules)` reads config.json + safetensors (one file, or shards listed in
`model.safetensors.index.json`), builds the decoder abstractly, and places each tensor straight
onto its sharding, so a model is never materialised unsharded on one device. `save_hf` writes
safetensors (sharded with an index above `max_shard_bytes`) plus the config and tokenizer files.
"""
from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from dockyard.models import name_map
from dockyard.trainer_jax import lora, quant
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.model import Decoder, ExpertBias, RouterStats
from dockyard.models.model_config import ModelConfig

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# Files copied along with the weights so that the saved directory is a complete HF checkpoint.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja")


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of an HF directory as NumPy (bfloat16 comes back as ml_dtypes.bfloat16)."""
  index = os.path.join(path, INDEX)
  if os.path.exists(index):
    with open(index) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
  elif os.path.exists(os.path.join(path, SINGLE)):
    files = [SINGLE]
  else:
    raise FileNotFoundError(f"{path!r} has neither {SINGLE} nor {INDEX}")
  out = {}
  # The "flax" reader handles bfloat16 (NumPy's does not); host CPU keeps accelerator memory free
  # until each tensor is placed on its own sharding.
  with jax.default_device(jax.devices("cpu")[0]):
    for name in files:
      with safe_open(os.path.join(path, name), framework="flax") as f:
        for key in f.keys():
          out[key] = np.asarray(f.get_tensor(key))
  return out


def abstract_decoder(c: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32, remat=False):
  """The decoder with ShapeDtypeStructs for values: shapes and logical axes, no memory."""
  with nnx.use_eager_sharding(False):
    return nnx.eval_shape(lambda: Decoder(c, dtype=dtype, param_dtype=param_dtype, remat=remat,
                                          rngs=nnx.Rngs(0)))


def from_hf(path: str, mesh=None, rules=(), *, dtype=jnp.float32, param_dtype=jnp.float32,
            remat: bool = False, tensors: dict[str, np.ndarray] | None = None) -> Decoder:
  """Loads an HF checkpoint directory into a (sharded) NNX decoder; `tensors`, when given, are
  the directory's HF tensors already read (and edited: a reward model's, less its score head)."""
  c = ModelConfig.from_pretrained(path)
  mesh = mesh if mesh is not None else shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  arrays = name_map.from_hf(read_safetensors(path) if tensors is None else tensors, c)
  model = abstract_decoder(c, dtype=dtype, param_dtype=param_dtype, remat=remat)
  graphdef, state = nnx.split(model)
  shardings = shd.state_shardings(state, rules, mesh)
  flat = dict(nnx.to_flat_state(state))
  flat_shardings = dict(nnx.to_flat_state(shardings))
  for key, var in flat.items():
    dotted = ".".join(str(k) for k in key)
    if dotted in ("inv_freq", "inv_freq_local"):   # RoPE constants, from the config
      value = c.inv_freq(local=dotted == "inv_freq_local")
    elif isinstance(var, (RouterStats, ExpertBias)):  # trainer state an HF checkpoint has no part of
      value = np.zeros(var.shape, np.float32)
    elif dotted in arrays:
      value = arrays.pop(dotted)
    else:
      raise KeyError(f"decoder parameter {dotted!r} has no tensor in {path!r}")
    if tuple(value.shape) != tuple(var.shape):
      raise ValueError(f"{dotted}: checkpoint shape {value.shape} != model shape {var.shape}")
    dt = jnp.float32 if dotted in ("inv_freq", "inv_freq_local") else var.dtype
    var.set_value(jax.device_put(np.asarray(value).astype(dt), flat_shardings[key]))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def named_params(model: Decoder) -> dict[str, jax.Array]:
  """NNX parameters by dotted path (the name-map's left column), as an HF checkpoint holds
  them: a quantized base (`policy.lora.base_quant`) dequantized, LoRA adapters, if any, merged
  into their kernels (`kernel + scale * a . b`)."""
  out = {".".join(str(k) for k in key): v.get_value()
         for key, v in nnx.to_flat_state(nnx.state(model, lora.BASE_FILTER))}
  out.update({k: quant.dequantized(v) for k, v in quant.quantized_weights(model).items()})
  out.update(lora.merged_kernels(model))
  return out


def to_numpy(x) -> np.ndarray:
  """A (possibly sharded) array gathered to host NumPy."""
  return np.asarray(jax.device_get(x))


def save_hf(model: Decoder, path: str, source_dir: str | None = None, *, dtype=None,
            max_shard_bytes: int = 5 << 30) -> None:
  """Writes an HF directory: safetensors (+ index when sharded), and the side files of `source_dir`."""
  os.makedirs(path, exist_ok=True)
  params = {k: to_numpy(v) for k, v in named_params(model).items()}
  tensors = {}
  for hf, arr in name_map.to_hf(params, model.config):
    tensors[hf] = np.ascontiguousarray(arr, dtype=dtype)   # safetensors writes C order
  shards, current, size = [], {}, 0
  for name, arr in tensors.items():
    if current and size + arr.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = arr
    size += arr.nbytes
  shards.append(current)
  for stale in (SINGLE, INDEX):
    if os.path.exists(os.path.join(path, stale)):
      os.remove(os.path.join(path, stale))
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, SINGLE), metadata={"format": "pt"})
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
      weight_map.update({name: fname for name in shard})
    total = sum(a.nbytes for a in tensors.values())
    with open(os.path.join(path, INDEX), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  if source_dir and os.path.abspath(source_dir) != os.path.abspath(path):
    for name in SIDE_FILES:
      if os.path.exists(os.path.join(source_dir, name)):
        shutil.copy(os.path.join(source_dir, name), os.path.join(path, name))

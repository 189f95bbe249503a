"""A quantized frozen base under LoRA (QLoRA): int8 or NF4 weights, dequantized on the fly.

Under LoRA the base weights never train, yet held in fp32 they are most of what a LoRA run keeps
in memory (4 B/param against the adapters' few MB). `quantize_base(model, fmt, mesh, rules)`
replaces, after the adapters attach, the kernel of every projection (`HeadsProj`, `OutProj`,
`Dense`: the targeted and the untargeted ones, an untied LM head included) and the embedding
table by a `QuantizedWeight`:

- 'int8': per-output-channel absmax (scale = absmax / 127 over the kernel's input axes; per
  token row for the embedding), int8 codes the kernel's shape: ~1 B/param.
- 'nf4': QLoRA's 4-bit NormalFloat: the 16 levels of `NF4_LEVELS`, an fp32 absmax scale per
  block of 64 consecutive (row-major, as QLoRA's flattened blocks) elements of the trailing axes
  (the last one, or the last few when it is not a multiple of 64, `nf4_trailing`; a ragged last
  block is zero-padded), two codes per uint8 byte: 0.5625 B/param. QLoRA's double quantization
  of the scales is not done.

A `QuantizedWeight` is an `nnx.Variable`, not an `nnx.Param`: the optimizer (`wrt=nnx.LoRAParam`),
adapter checkpoints and `lora.BASE_FILTER` never see it as something that trains. Its raw value
(what nnx.split / jit / donation carry) is {'codes', 'scales'}; reading it (`w[...]`,
`w.astype(...)`, `x @ w`, `w.shape`) gives the dequantized array in the kernel's dtype, so the
decoder's modules compute with it unchanged, and the export and a merge refit send exactly the
weights the trainer's forward uses. Codes and scales keep the kernel's leading axes and their
logical names, so they shard like the kernel (an axis that does not divide replicates,
`sharding.logical_to_spec`; NF4's blocked axis takes the name of its major dimension).
Norm scales, biases and the RoPE constants stay as they are (small); so do Mixture-of-Experts
expert stacks (not `Dense`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.typing import MISSING, Missing
from jax.sharding import NamedSharding

from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.model import Dense, HeadsProj, OutProj

FORMATS = ("int8", "nf4")
NF4_BLOCK = 64
# QLoRA's NormalFloat4 levels (Dettmers et al. 2023, appendix E; bitsandbytes' NF4 table).
NF4_LEVELS = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)
# Largest |w - dequantized(w)| as a fraction of the scale: half the widest gap between levels.
ERROR_BOUND = {"int8": 0.5 / 127, "nf4": float(np.max(np.diff(NF4_LEVELS))) / 2}


# --- the formats ---------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("reduce_axes",))
def quantize_int8(w, reduce_axes=(0,)):
  """{'codes': int8 like w, 'scales': fp32 absmax / 127 over `reduce_axes` (the input axes; kept
  as 1s)}: one scale per output channel."""
  w = w.astype(jnp.float32)
  absmax = jnp.max(jnp.abs(w), axis=tuple(reduce_axes), keepdims=True)
  scales = jnp.where(absmax > 0, absmax / 127.0, 1.0)
  codes = jnp.clip(jnp.round(w / scales), -127, 127).astype(jnp.int8)
  return dict(codes=codes, scales=scales)


def dequantize_int8(q, shape, dtype):
  return (q["codes"].astype(jnp.float32) * q["scales"]).reshape(shape).astype(dtype)


def nf4_trailing(shape) -> int:
  """How many trailing axes NF4 flattens into its blocked axis: the fewest whose product is a
  multiple of 64 (a q/k/v kernel with head_dim 32 blocks across heads instead of padding each
  head), at most all but the first axis."""
  for k in range(1, len(shape)):
    if int(np.prod(shape[-k:])) % NF4_BLOCK == 0:
      return k
  return max(1, len(shape) - 1)


@jax.jit
def quantize_nf4(w):
  """{'codes': uint8 [*lead, nb * 32] (code 2i in the low nibble, 2i+1 in the high), 'scales':
  fp32 [*lead, nb]}: the trailing `nf4_trailing` axes flattened row-major into one (zero-padded
  to nb * 64) and cut into blocks of 64, each scaled by its absmax, every element mapped to the
  nearest of the 16 NF4 levels."""
  k = nf4_trailing(w.shape)
  lead = w.shape[:len(w.shape) - k]
  n = int(np.prod(w.shape[len(w.shape) - k:]))
  nb = -(-n // NF4_BLOCK)
  w = jnp.pad(w.astype(jnp.float32).reshape(lead + (n,)), [(0, 0)] * len(lead) + [(0, nb * NF4_BLOCK - n)])
  blocks = w.reshape(lead + (nb, NF4_BLOCK))
  absmax = jnp.max(jnp.abs(blocks), axis=-1)
  scales = jnp.where(absmax > 0, absmax, 1.0)
  levels = jnp.asarray(NF4_LEVELS)
  # Nearest level: the count of midpoints below the normalized value.
  codes = jnp.searchsorted((levels[1:] + levels[:-1]) / 2, blocks / scales[..., None]).astype(jnp.uint8)
  codes = codes.reshape(lead + (nb * NF4_BLOCK // 2, 2))
  packed = codes[..., 0] | (codes[..., 1] << 4)
  return dict(codes=packed, scales=scales)


def nf4_codes(q) -> jax.Array:
  """The unpacked 4-bit codes [..., nb * 64] (uint8 in 0..15) of an NF4 weight."""
  packed = q["codes"]
  pairs = jnp.stack([packed & 0xF, packed >> 4], axis=-1)
  return pairs.reshape(packed.shape[:-1] + (packed.shape[-1] * 2,))


def dequantize_nf4(q, shape, dtype):
  codes = nf4_codes(q)
  nb = q["scales"].shape[-1]
  values = jnp.asarray(NF4_LEVELS)[codes].reshape(codes.shape[:-1] + (nb, NF4_BLOCK))
  w = (values * q["scales"][..., None]).reshape(codes.shape)
  n = int(np.prod(shape[len(shape) - nf4_trailing(shape):]))
  return w[..., :n].reshape(shape).astype(dtype)


def quantize(w, fmt: str, reduce_axes=(0,)):
  """`w` quantized in `fmt`; `reduce_axes` (int8): the input axes a scale spans."""
  if fmt == "int8":
    return quantize_int8(w, tuple(reduce_axes))
  if fmt == "nf4":
    return quantize_nf4(w)
  raise ValueError(f"policy.lora.base_quant: must be one of {('none',) + FORMATS}, got {fmt!r}")


def dequantize(q, fmt: str, shape, dtype=jnp.float32):
  return (dequantize_int8 if fmt == "int8" else dequantize_nf4)(q, tuple(shape), dtype)


# --- the Variable ----------------------------------------------------------------------------

class QuantizedWeight(nnx.Variable):
  """A frozen base weight held as {'codes', 'scales'}; every read gives the dequantized array.

  Metadata (static, carried through split / merge / jit): `quant_format`, `quant_shape`,
  `quant_dtype` (the dtype a read returns, the kernel's own), `quant_axes` (its logical axes)."""

  def get_value(self, *, index=MISSING) -> jax.Array:   # noqa: D102 (nnx.Variable's)
    meta = self.get_metadata()
    w = dequantize(self.get_raw_value(), meta["quant_format"], meta["quant_shape"],
                   jnp.dtype(meta["quant_dtype"]))
    if isinstance(index, Missing) or index is ...:
      return w
    return w[index]

  def set_value(self, value, **kw):
    raise TypeError("a QuantizedWeight is a frozen base weight: it has no setter "
                    "(quantize a new array with dockyard.trainer_jax.quant.quantize)")

  def __getattr__(self, name: str):
    if name.startswith("__"):
      raise AttributeError(name)
    meta = object.__getattribute__(self, "_var_metadata")
    if name in meta:
      return meta[name]
    return getattr(self.get_value(), name)   # astype, T, ... of the dequantized array

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.get_metadata()["quant_shape"])

  @property
  def dtype(self):
    return jnp.dtype(self.get_metadata()["quant_dtype"])

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def nbytes(self) -> int:
    """The bytes held (codes + scales), not the dequantized array's."""
    return int(sum(x.nbytes for x in jax.tree.leaves(self.get_raw_value())))


def _quantized_axes(fmt: str, axes, shape, reduce_axes):
  """((logical axes, shape) of the codes, (the same) of the scales) of a quantized weight."""
  if fmt == "int8":
    keep = lambda seq, gone: tuple(gone if d in reduce_axes else x for d, x in enumerate(seq))
    return (tuple(axes), tuple(shape)), (keep(axes, None), keep(shape, 1))
  # The flattened axis takes the logical axis of its first (major) dimension: a row-major split
  # of it into n equal parts is a split of that dimension.
  lead = len(shape) - nf4_trailing(shape)
  nb = -(-int(np.prod(shape[lead:])) // NF4_BLOCK)
  ax = tuple(axes[:lead + 1])
  return ((ax, tuple(shape[:lead]) + (nb * NF4_BLOCK // 2,)), (ax, tuple(shape[:lead]) + (nb,)))


def quantize_variable(var: nnx.Variable, fmt: str, mesh, rules, reduce_axes=(0,)) -> QuantizedWeight:
  """`var` (an array Variable) as a QuantizedWeight; codes and scales placed on the shardings
  its logical axes give them."""
  shape, dtype = tuple(var.shape), jnp.dtype(var.dtype)
  axes = tuple(var.get_metadata().get("out_sharding") or (None,) * len(shape))
  q = quantize(var[...], fmt, tuple(reduce_axes))
  (c_axes, c_shape), (s_axes, s_shape) = _quantized_axes(fmt, axes, shape, tuple(reduce_axes))
  assert tuple(q["codes"].shape) == c_shape and tuple(q["scales"].shape) == s_shape, (q, c_shape, s_shape)
  place = lambda x, ax: jax.device_put(x, NamedSharding(mesh, shd.logical_to_spec(ax, x.shape, rules, mesh)))
  value = dict(codes=place(q["codes"], c_axes), scales=place(q["scales"], s_axes))
  with nnx.use_eager_sharding(False):
    return QuantizedWeight(value, quant_format=fmt, quant_shape=shape, quant_dtype=dtype.name,
                           quant_axes=axes)


def base_weights(model):
  """(module, attribute, input axes) for every weight `quantize_base` quantizes: the projections'
  kernels (reduced over their input axes: one int8 scale per output channel) and the embedding
  table [vocab, embed] (reduced over embed: a scale per token row, the tied LM head's output
  channel too)."""
  for _, module in model.iter_modules():
    if isinstance(module, (HeadsProj, OutProj, Dense)):
      yield module, "kernel", (0, 1) if isinstance(module, OutProj) else (0,)
    elif isinstance(module, nnx.Embed):
      yield module, "embedding", (1,)


def quantize_base(model, fmt: str, mesh, rules) -> int:
  """Replaces (in place) every projection kernel and the embedding table of `model` by its
  quantized form; returns how many weights it replaced. Call it after `lora.attach` (which
  reads the kernels' shapes, dtypes and axes) and before the optimizer is built."""
  if fmt not in FORMATS:
    raise ValueError(f"policy.lora.base_quant: must be one of {('none',) + FORMATS}, got {fmt!r}")
  n = 0
  for module, attr, reduce_axes in list(base_weights(model)):
    var = getattr(module, attr)
    if isinstance(var, QuantizedWeight):
      raise ValueError(f"{type(module).__name__}.{attr} is already quantized")
    setattr(module, attr, quantize_variable(var, fmt, mesh, rules, reduce_axes))
    n += 1
  return n


@functools.partial(jax.jit, static_argnames=("fmt", "shape", "dtype"))
def _dequantize_jit(q, fmt, shape, dtype):
  return dequantize(q, fmt, shape, dtype)


def dequantized(var: QuantizedWeight) -> jax.Array:
  """The dequantized array of `var`, computed in one compiled call (outside a trace, a read
  of `var[...]` would run op by op)."""
  meta = var.get_metadata()
  return _dequantize_jit(var.get_raw_value(), meta["quant_format"], tuple(meta["quant_shape"]),
                         jnp.dtype(meta["quant_dtype"]))


def quantized_weights(model) -> dict[str, QuantizedWeight]:
  """Dotted NNX path -> QuantizedWeight, for every quantized weight of `model`."""
  return {".".join(str(k) for k in key): v
          for key, v in nnx.to_flat_state(nnx.state(model, QuantizedWeight))}

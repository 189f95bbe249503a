"""The decoder's architecture as a dataclass, read from an HF `config.json` (Qwen2 / Qwen3 / Llama /
Qwen3-MoE / Gemma 3 text / Qwen3-Next).

Pure Python (no JAX import): both trainers and the name-map (`name_map.py`) use it. Every
knob the decoder and the name-map need lives here; anything in config.json that would change the
math but is not implemented (Qwen2's sliding window, soft-capping, unknown RoPE types, other
activations) is refused with an error that names the key, instead of silently producing a
different model.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping

import numpy as np

# model_type -> family. The families differ only in which optional pieces they use.
FAMILIES = {"qwen2": "qwen2", "qwen3": "qwen3", "llama": "llama", "qwen3_moe": "qwen3_moe",
            "gemma3_text": "gemma3", "qwen3_next": "qwen3_next"}
MOE_FAMILIES = ("qwen3_moe", "qwen3_next")   # qwen3_next: when num_experts > 0
ROPE_TYPES = ("default", "linear", "llama3")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")   # SwiGLU / GeGLU (tanh-approximated GELU)
GEMMA3_LAYER_TYPES = ("sliding_attention", "full_attention")
QWEN3_NEXT_LAYER_TYPES = ("linear_attention", "full_attention")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  family: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float
  rope_theta: float
  rope_type: str = "default"
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_positions: int = 8192
  tie_word_embeddings: bool = False
  qkv_bias: bool = False       # Qwen2 always; Llama / Qwen3 when attention_bias
  o_bias: bool = False         # Llama / Qwen3 when attention_bias
  mlp_bias: bool = False       # Llama when mlp_bias
  qk_norm: bool = False        # Qwen3
  max_position_embeddings: int = 4096
  # Mixture of experts (Qwen3-MoE); num_experts == 0 is a dense model.
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False    # renormalise the top-k routing weights to sum to 1
  moe_layers: tuple = ()          # indices of the sparse (MoE) layers; the others are dense MLPs
  # Gemma 3's pieces (all off for the other families).
  hidden_act: str = "silu"        # the gated MLP's activation, one of ACTIVATIONS
  norm_plus_one: bool = False     # RMSNorm scales by (1 + weight), weight initialised to 0
  sandwich_norms: bool = False    # + post-attention and pre/post-feedforward norms in each layer
  embed_scale: bool = False       # embeddings times sqrt(hidden_size), in the compute dtype
  query_pre_attn_scalar: float = 0.0   # > 0: attention scale query_pre_attn_scalar**-0.5
  sliding_window: int = 0         # keys a sliding layer's query sees, itself included
  sliding_layers: tuple = ()      # indices of the sliding-window layers; RoPE base rope_local_theta
  rope_local_theta: float = 0.0   # the sliding layers' RoPE base (no scaling)
  # Qwen3-Next's pieces: Gated DeltaNet ("linear attention") layers beside gated full attention.
  rotary_dim: int = 0             # > 0: RoPE turns only the first rotary_dim of each head (partial)
  attn_output_gate: bool = False  # q_proj emits [query | gate] per head; output *= sigmoid(gate)
  linear_layers: tuple = ()       # indices of the Gated DeltaNet layers; the others full attention
  linear_num_key_heads: int = 0
  linear_num_value_heads: int = 0
  linear_key_head_dim: int = 0
  linear_value_head_dim: int = 0
  linear_conv_kernel: int = 0     # the causal depthwise conv1d's width over q/k/v
  shared_expert_intermediate_size: int = 0   # > 0: each sparse block adds a sigmoid-gated shared expert

  @property
  def is_moe(self) -> bool:
    return self.num_experts > 0

  @property
  def attn_scale(self) -> float | None:
    """The attention logits' scale; None: head_dim**-0.5 (the attention kernels' default)."""
    return self.query_pre_attn_scalar ** -0.5 if self.query_pre_attn_scalar > 0 else None

  @classmethod
  def from_hf_config(cls, hf: Mapping[str, Any]) -> "ModelConfig":
    """Builds from a parsed config.json (transformers 4 `rope_scaling` or 5 `rope_parameters`)."""
    model_type = hf.get("model_type")
    if model_type not in FAMILIES:
      raise ValueError(f"config.json model_type={model_type!r} is not supported; supported: {sorted(FAMILIES)}")
    family = FAMILIES[model_type]
    if family == "gemma3":   # transformers' Gemma3MLP reads hidden_activation (GeGLU by default)
      act = hf.get("hidden_activation", "gelu_pytorch_tanh")
      if act not in ACTIVATIONS:
        raise ValueError(f"config.json hidden_activation={act!r} is not implemented; supported: {ACTIVATIONS}")
    else:
      act = hf.get("hidden_act", "silu")
      if act != "silu":
        raise ValueError(f"config.json hidden_act={act!r}: only 'silu' (SwiGLU) is implemented")
    if hf.get("use_sliding_window"):
      raise ValueError("config.json use_sliding_window=True: sliding-window attention is not implemented")
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or hf["hidden_size"] // heads)
    if family == "gemma3":
      rope, gemma = _gemma3_fields(hf, int(hf["num_hidden_layers"]))
    else:
      rope, gemma = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}, {}
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    if rope_type not in ROPE_TYPES:
      raise ValueError(f"config.json rope type {rope_type!r} is not implemented; supported: {ROPE_TYPES}")
    partial = float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if partial != 1.0 and family != "qwen3_next":
      raise ValueError("config.json partial_rotary_factor != 1 is not implemented")
    attention_bias = bool(hf.get("attention_bias", False))
    moe = _moe_fields(hf, int(hf["num_hidden_layers"])) if family in MOE_FAMILIES else {}
    nxt = _qwen3_next_fields(hf, int(hf["num_hidden_layers"]), head_dim, partial) if family == "qwen3_next" else {}
    return cls(
        family=family,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_type=rope_type,
        rope_factor=float(rope.get("factor", 1.0)),
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        rope_original_max_positions=int(rope.get("original_max_position_embeddings", 8192)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=True if family == "qwen2" else attention_bias,
        o_bias=False if family == "qwen2" else attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)) if family == "llama" else False,
        qk_norm=family in ("qwen3", "qwen3_moe", "gemma3", "qwen3_next"),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        hidden_act=act,
        **moe,
        **gemma,
        **nxt,
    )

  @classmethod
  def from_pretrained(cls, path: str) -> "ModelConfig":
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
      raise FileNotFoundError(f"{path!r} is not an HF checkpoint directory: no config.json")
    with open(cfg_path) as f:
      return cls.from_hf_config(json.load(f))

  def inv_freq(self, local: bool = False) -> np.ndarray:
    """RoPE inverse frequencies [rotary_dim/2] in float32, as transformers computes them;
    `local`: the sliding-window layers' (base rope_local_theta, unscaled)."""
    d = self.rotary_dim or self.head_dim
    theta = self.rope_local_theta if local else self.rope_theta
    inv = (1.0 / (theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))).astype(np.float32)
    if local:
      return inv
    if self.rope_type == "linear":
      inv = inv / np.float32(self.rope_factor)
    elif self.rope_type == "llama3":
      factor, lo, hi = self.rope_factor, self.rope_low_freq_factor, self.rope_high_freq_factor
      old = self.rope_original_max_positions
      low_wavelen, high_wavelen = old / lo, old / hi
      wavelen = 2 * math.pi / inv
      scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
      smooth = (old / wavelen - lo) / (hi - lo)
      smoothed = (1 - smooth) * scaled / factor + smooth * scaled
      medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
      inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)

  def num_params(self, active: bool = False) -> int:
    """Parameter count (biases aside); `active`: counting only the top-k experts a token uses."""
    e, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    attn = e * (q * (2 if self.attn_output_gate else 1) + 2 * kv) + q * e + (4 if self.sandwich_norms else 2) * e
    kd = self.linear_num_key_heads * self.linear_key_head_dim
    vd = self.linear_num_value_heads * self.linear_value_head_dim
    nv = self.linear_num_value_heads
    linear = (e * (2 * kd + 2 * vd + 2 * nv) + (2 * kd + vd) * self.linear_conv_kernel + 2 * nv
              + self.linear_value_head_dim + vd * e + 2 * e)
    experts = self.num_experts_per_tok if active else self.num_experts
    shared = 3 * e * self.shared_expert_intermediate_size + e if self.shared_expert_intermediate_size else 0
    sparse = e * self.num_experts + 3 * e * self.moe_intermediate_size * experts + shared
    layers = sum((linear if i in self.linear_layers else attn) + (sparse if i in self.moe_layers else 3 * e * f)
                 for i in range(self.num_layers))
    return v * e * (1 if self.tie_word_embeddings else 2) + layers + e


def _moe_fields(hf: Mapping[str, Any], num_layers: int) -> dict:
  """Qwen3-MoE's expert knobs; a layer is sparse unless in `mlp_only_layers`, every
  `decoder_sparse_step`-th one (as transformers' Qwen3MoeDecoderLayer decides)."""
  experts = int(hf.get("num_experts") or hf.get("num_local_experts") or 0)
  if experts < 1 and hf.get("model_type") == "qwen3_next":   # a dense Qwen3-Next: MLPs only
    return {}
  if experts < 1:
    raise ValueError("config.json num_experts (or num_local_experts) must be >= 1 for qwen3_moe")
  top_k = int(hf.get("num_experts_per_tok", 0))
  if not 1 <= top_k <= experts:
    raise ValueError(f"config.json num_experts_per_tok={top_k} must be in [1, num_experts={experts}]")
  step = int(hf.get("decoder_sparse_step", 1))
  if step < 1:
    raise ValueError(f"config.json decoder_sparse_step={step} must be >= 1")
  dense = set(int(i) for i in (hf.get("mlp_only_layers") or ()))
  return dict(
      num_experts=experts, num_experts_per_tok=top_k,
      moe_intermediate_size=int(hf["moe_intermediate_size"]),
      norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
      moe_layers=tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0))


def _gemma3_fields(hf: Mapping[str, Any], num_layers: int) -> tuple[dict, dict]:
  """Gemma 3 (text)'s RoPE parameters of its full-attention layers, and its other knobs, as
  transformers' Gemma3TextConfig reads them: transformers 5 writes `rope_parameters` keyed by
  layer type; transformers 4 wrote `rope_theta`, `rope_scaling` (full-attention layers) and
  `rope_local_base_freq`. Layers are typed by `layer_types`, else every
  `sliding_window_pattern`-th layer (default 6) is full attention and the others slide."""
  for key in ("attn_logit_softcapping", "final_logit_softcapping"):
    if hf.get(key) is not None:
      raise ValueError(f"config.json {key}={hf[key]!r}: logit soft-capping is not implemented (must be null)")
  if hf.get("use_bidirectional_attention"):
    raise ValueError("config.json use_bidirectional_attention=True: only causal attention is implemented")
  params = hf.get("rope_parameters")
  if params:
    if not set(params) <= set(GEMMA3_LAYER_TYPES) or "full_attention" not in params:
      raise ValueError(f"config.json rope_parameters={params!r}: gemma3_text expects one entry per layer "
                       f"type {GEMMA3_LAYER_TYPES}")
    full = dict(params["full_attention"] or {})
    local = dict(params.get("sliding_attention") or {})
    local_theta = float(local.get("rope_theta", hf.get("rope_local_base_freq", 10000.0)))
  else:
    full = {"rope_theta": float(hf.get("rope_theta", 1_000_000.0)), **(hf.get("rope_scaling") or {})}
    local, local_theta = {}, float(hf.get("rope_local_base_freq", 10000.0))
  full.setdefault("rope_theta", float(hf.get("rope_theta", 1_000_000.0)))
  full_type = full.get("rope_type", full.get("type", "default")) or "default"
  if full_type not in ROPE_TYPES:
    key = "rope_parameters.full_attention.rope_type" if params else "rope_scaling.rope_type"
    raise ValueError(f"config.json {key}={full_type!r} is not implemented; supported: {ROPE_TYPES}")
  local_type = local.get("rope_type", local.get("type", "default")) or "default"
  if local_type != "default":
    raise ValueError(f"config.json rope_parameters.sliding_attention.rope_type={local_type!r}: the sliding "
                     f"layers' RoPE must be 'default' (unscaled)")
  types = _layer_types(hf, num_layers, ("sliding_window_pattern", "_sliding_window_pattern"), 6,
                       "sliding_attention", GEMMA3_LAYER_TYPES)
  sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
  window = hf.get("sliding_window")
  if sliding and (window is None or int(window) < 1):
    raise ValueError(f"config.json sliding_window={window!r}: layer_types has sliding layers, so it must be >= 1")
  scalar = float(hf.get("query_pre_attn_scalar", 256))
  if scalar <= 0:
    raise ValueError(f"config.json query_pre_attn_scalar={scalar} must be > 0")
  return full, dict(norm_plus_one=True, sandwich_norms=True, embed_scale=True, query_pre_attn_scalar=scalar,
                    sliding_window=int(window) if sliding else 0, sliding_layers=sliding,
                    rope_local_theta=local_theta)


def _layer_types(hf: Mapping[str, Any], num_layers: int, interval_keys: tuple[str, ...], default: int,
                 other: str, allowed: tuple[str, ...]) -> list[str]:
  """config.json's `layer_types`, else (as transformers derives them) every n-th layer
  'full_attention' and the others `other`, n from the first of `interval_keys` present (else
  `default`); checked: one entry per layer, each in `allowed`."""
  types = hf.get("layer_types")
  if types is None:
    n = int(next((hf[k] for k in interval_keys if k in hf), default))
    if n < 1:
      raise ValueError(f"config.json {interval_keys[0]}={n} must be >= 1")
    types = [other if (i + 1) % n else "full_attention" for i in range(num_layers)]
  if len(types) != num_layers or not set(types) <= set(allowed):
    raise ValueError(f"config.json layer_types must list {num_layers} entries of {allowed}, got {list(types)!r}")
  return list(types)


def _qwen3_next_fields(hf: Mapping[str, Any], num_layers: int, head_dim: int, partial: float) -> dict:
  """Qwen3-Next's knobs, as transformers' Qwen3NextConfig reads them: layers typed by
  `layer_types`, else every `full_attention_interval`-th (default 4) is full attention and the
  others Gated DeltaNet; RoPE over the first `partial_rotary_factor` of each head; the sparse
  blocks' shared expert (when num_experts > 0)."""
  if hf.get("attention_bias"):
    raise ValueError("config.json attention_bias=True is not implemented for qwen3_next (no checkpoint has it)")
  types = _layer_types(hf, num_layers, ("full_attention_interval",), 4, "linear_attention",
                       QWEN3_NEXT_LAYER_TYPES)
  rotary = int(head_dim * partial)
  if not 0 < rotary <= head_dim or rotary % 2:
    raise ValueError(f"config.json partial_rotary_factor={partial}: head_dim {head_dim} x it must be an even "
                     f"number of dimensions in (0, head_dim]")
  nk, nv = int(hf.get("linear_num_key_heads", 16)), int(hf.get("linear_num_value_heads", 32))
  if nk < 1 or nv % nk:
    raise ValueError(f"config.json linear_num_value_heads={nv} must be a multiple of linear_num_key_heads={nk}")
  kernel = int(hf.get("linear_conv_kernel_dim", 4))
  if kernel < 1:
    raise ValueError(f"config.json linear_conv_kernel_dim={kernel} must be >= 1")
  shared = 0
  if int(hf.get("num_experts") or 0) > 0:
    shared = int(hf.get("shared_expert_intermediate_size", 0))
    if shared < 1:
      raise ValueError(f"config.json shared_expert_intermediate_size={shared} must be >= 1 (the sparse "
                       f"blocks always add a shared expert)")
  return dict(norm_plus_one=True, attn_output_gate=True, rotary_dim=0 if rotary == head_dim else rotary,
              linear_layers=tuple(i for i, t in enumerate(types) if t == "linear_attention"),
              linear_num_key_heads=nk, linear_num_value_heads=nv,
              linear_key_head_dim=int(hf.get("linear_key_head_dim", 128)),
              linear_value_head_dim=int(hf.get("linear_value_head_dim", 128)),
              linear_conv_kernel=kernel, shared_expert_intermediate_size=shared)

"""The one place that knows HF parameter names: NNX parameter path <-> HF name + layout transform.

One table per family (Qwen2 / Qwen3 / Llama / Qwen3-MoE / Gemma 3 / Qwen3-Next share the decoder
layout and differ in optional pieces: q/k/v bias, o bias, MLP bias, q/k norm, tied embeddings,
sparse layers, Gemma's pre/post-feedforward norms, Qwen3-Next's Gated DeltaNet layers and shared
experts). Each `Entry` says how an HF tensor becomes the NNX array and back:

  identity     same layout (embeddings, norms, o/mlp biases)
  transpose    HF Linear [out, in]  <-> NNX kernel [in, out]           (MLP, lm_head)
  heads_in     HF [heads*head_dim, embed] <-> NNX [embed, heads, head_dim]  (q/k/v proj)
  heads_out    HF [embed, heads*head_dim] <-> NNX [heads, head_dim, embed]  (o proj)
  heads_bias   HF [heads*head_dim] <-> NNX [heads, head_dim]          (q/k/v bias)
  conv         HF Conv1d [channels, 1, width] <-> NNX [width, channels]  (Gated DeltaNet conv1d)

Qwen3-Next's q_proj is `heads_in` with head_dim doubled ([query | gate] per head, HF's order);
its Gated DeltaNet input projections are `heads_in` over the key heads (HF groups q, k, v, z and
b, a by key head, see `trainer_jax.model.GatedDeltaNet`); `mtp.*` tensors (the multi-token
prediction head, which transformers also ignores) are skipped on load.

An entry with `expert >= 0` is one slice of a stacked NNX expert kernel [experts, in, out]: HF
checkpoints (and vLLM) name each expert's Linear apart (`mlp.experts.{j}.gate_proj.weight`, the
layout transformers 5 also writes with `save_pretrained`), so expert j's HF tensor is the
`transpose` of NNX slice [j]; `from_hf` stacks the slices back. In memory, transformers 5 fuses
each sparse layer's experts into two 3-D parameters (`mlp.experts.gate_up_proj` [E, 2F, D], gate rows
first, and `mlp.experts.down_proj` [E, D, F]); `module_param` says where a checkpoint name lives in
them (the torch trainer's view of the same table).

`to_hf(named_nnx_arrays, config)` streams `(hf_name, np.ndarray)` in exactly the layout vLLM and
transformers load (the rollout side feeds it to vLLM's `reload_weights`); `from_hf` is the
inverse. NumPy only: no JAX import, so the rollout side can use it without a trainer.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Mapping

import numpy as np

from dockyard.models.model_config import ModelConfig

TRANSFORMS = ("identity", "transpose", "heads_in", "heads_out", "heads_bias", "conv")


@dataclasses.dataclass(frozen=True)
class Entry:
  nnx: str          # dotted NNX path, e.g. 'layers.0.attn.q_proj.kernel'
  hf: str           # HF name, e.g. 'model.layers.0.self_attn.q_proj.weight'
  transform: str    # one of TRANSFORMS
  heads: int = 0    # for the heads_* transforms
  expert: int = -1  # >= 0: this HF tensor is slice [expert] of the NNX array


def _linear_attn_entries(n: str, h: str, c: ModelConfig) -> list[Entry]:
  """A Qwen3-Next Gated DeltaNet layer (NNX `linear_attn`, HF `linear_attn`)."""
  nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
  return [
      Entry(f"{n}.linear_attn.in_proj_qkvz.kernel", f"{h}.linear_attn.in_proj_qkvz.weight", "heads_in", nk),
      Entry(f"{n}.linear_attn.in_proj_ba.kernel", f"{h}.linear_attn.in_proj_ba.weight", "heads_in", nk),
      Entry(f"{n}.linear_attn.conv1d", f"{h}.linear_attn.conv1d.weight", "conv"),
      Entry(f"{n}.linear_attn.dt_bias", f"{h}.linear_attn.dt_bias", "identity"),
      Entry(f"{n}.linear_attn.A_log", f"{h}.linear_attn.A_log", "identity"),
      Entry(f"{n}.linear_attn.norm.scale", f"{h}.linear_attn.norm.weight", "identity"),
      Entry(f"{n}.linear_attn.out_proj.kernel", f"{h}.linear_attn.out_proj.weight", "heads_out", nv),
  ]


def _layer_entries(i: int, c: ModelConfig) -> list[Entry]:
  n, h = f"layers.{i}", f"model.layers.{i}"
  out = [
      Entry(f"{n}.input_norm.scale", f"{h}.input_layernorm.weight", "identity"),
      Entry(f"{n}.post_attn_norm.scale", f"{h}.post_attention_layernorm.weight", "identity"),
  ]
  linear = i in c.linear_layers
  if linear:
    out += _linear_attn_entries(n, h, c)
  else:
    out += [
        Entry(f"{n}.attn.q_proj.kernel", f"{h}.self_attn.q_proj.weight", "heads_in", c.num_heads),
        Entry(f"{n}.attn.k_proj.kernel", f"{h}.self_attn.k_proj.weight", "heads_in", c.num_kv_heads),
        Entry(f"{n}.attn.v_proj.kernel", f"{h}.self_attn.v_proj.weight", "heads_in", c.num_kv_heads),
        Entry(f"{n}.attn.o_proj.kernel", f"{h}.self_attn.o_proj.weight", "heads_out", c.num_heads),
    ]
  if i in c.moe_layers:
    out.append(Entry(f"{n}.mlp.router.kernel", f"{h}.mlp.gate.weight", "transpose"))
    out += [Entry(f"{n}.mlp.{p}", f"{h}.mlp.experts.{j}.{p}.weight", "transpose", expert=j)
            for j in range(c.num_experts) for p in ("gate_proj", "up_proj", "down_proj")]
    if c.shared_expert_intermediate_size:
      out += [Entry(f"{n}.mlp.shared_expert.{p}.kernel", f"{h}.mlp.shared_expert.{p}.weight", "transpose")
              for p in ("gate_proj", "up_proj", "down_proj")]
      out.append(Entry(f"{n}.mlp.shared_expert_gate.kernel", f"{h}.mlp.shared_expert_gate.weight", "transpose"))
  else:
    out += [Entry(f"{n}.mlp.{p}.kernel", f"{h}.mlp.{p}.weight", "transpose")
            for p in ("gate_proj", "up_proj", "down_proj")]
  if linear:   # no q/k/v/o projections in a Gated DeltaNet layer (qwen3_next has no biases)
    return out
  if c.qkv_bias:
    out += [
        Entry(f"{n}.attn.q_proj.bias", f"{h}.self_attn.q_proj.bias", "heads_bias", c.num_heads),
        Entry(f"{n}.attn.k_proj.bias", f"{h}.self_attn.k_proj.bias", "heads_bias", c.num_kv_heads),
        Entry(f"{n}.attn.v_proj.bias", f"{h}.self_attn.v_proj.bias", "heads_bias", c.num_kv_heads),
    ]
  if c.o_bias:
    out.append(Entry(f"{n}.attn.o_proj.bias", f"{h}.self_attn.o_proj.bias", "identity"))
  if c.mlp_bias:
    out += [Entry(f"{n}.mlp.{p}.bias", f"{h}.mlp.{p}.bias", "identity")
            for p in ("gate_proj", "up_proj", "down_proj")]
  if c.qk_norm:
    out += [
        Entry(f"{n}.attn.q_norm.scale", f"{h}.self_attn.q_norm.weight", "identity"),
        Entry(f"{n}.attn.k_norm.scale", f"{h}.self_attn.k_norm.weight", "identity"),
    ]
  if c.sandwich_norms:   # Gemma: post_attn_norm is then the attention output's norm (see DecoderLayer)
    out += [
        Entry(f"{n}.pre_ffw_norm.scale", f"{h}.pre_feedforward_layernorm.weight", "identity"),
        Entry(f"{n}.post_ffw_norm.scale", f"{h}.post_feedforward_layernorm.weight", "identity"),
    ]
  return out


def table(config: ModelConfig) -> list[Entry]:
  """The full name table of one model, in HF's parameter order (embeddings, layers, norm, head)."""
  if config.family not in ("qwen2", "qwen3", "llama", "qwen3_moe", "gemma3", "qwen3_next"):
    raise ValueError(f"no name-map table for family {config.family!r}")
  entries = [Entry("embed.embedding", "model.embed_tokens.weight", "identity")]
  for i in range(config.num_layers):
    entries += _layer_entries(i, config)
  entries.append(Entry("final_norm.scale", "model.norm.weight", "identity"))
  if not config.tie_word_embeddings:
    entries.append(Entry("lm_head.kernel", "lm_head.weight", "transpose"))
  return entries


@dataclasses.dataclass(frozen=True)
class ModuleParam:
  """Where a table entry's HF checkpoint tensor lives in transformers' in-memory model: parameter
  `name`, and for a fused expert tensor its slice `[expert, rows[0]:rows[1]]` (rows None: all)."""
  name: str
  expert: int = -1
  rows: tuple[int, int] | None = None


def module_param(entry: Entry, config: ModelConfig) -> ModuleParam:
  """The transformers (5.x) parameter holding `entry.hf`: itself, except a Qwen3-MoE expert's
  Linear weights, which `Qwen3MoeExperts` keeps fused per layer (the conversion transformers
  applies on load: gate and up stacked over experts and concatenated on dim 1, down stacked)."""
  if entry.expert < 0:
    return ModuleParam(entry.hf)
  stem, proj = entry.hf.rsplit(f".experts.{entry.expert}.", 1)
  f = config.moe_intermediate_size
  if proj == "gate_proj.weight":
    return ModuleParam(f"{stem}.experts.gate_up_proj", entry.expert, (0, f))
  if proj == "up_proj.weight":
    return ModuleParam(f"{stem}.experts.gate_up_proj", entry.expert, (f, 2 * f))
  if proj == "down_proj.weight":
    return ModuleParam(f"{stem}.experts.down_proj", entry.expert)
  raise ValueError(f"no transformers parameter known for expert tensor {entry.hf!r}")


def hf_to_nnx_array(entry: Entry, x: np.ndarray) -> np.ndarray:
  t = entry.transform
  if t == "identity":
    return x
  if t == "transpose":
    return x.T
  if t == "heads_in":
    return x.T.reshape(x.shape[1], entry.heads, x.shape[0] // entry.heads)
  if t == "heads_out":
    return x.T.reshape(entry.heads, x.shape[1] // entry.heads, x.shape[0])
  if t == "heads_bias":
    return x.reshape(entry.heads, x.shape[0] // entry.heads)
  if t == "conv":   # [C, 1, K] -> [K, C]
    return x[:, 0, :].T
  raise ValueError(f"unknown transform {t!r} for {entry.hf}")


def nnx_to_hf_array(entry: Entry, x: np.ndarray) -> np.ndarray:
  """`x` in HF layout: a view of `x` (every transform is a transpose and/or a reshape of a
  C-ordered array), so not necessarily C-contiguous. A consumer that needs C order (safetensors,
  a wire format) makes it; a loader that copies into its own storage copies once, strided."""
  t = entry.transform
  if t == "identity":
    out = x
  elif t == "transpose":
    out = x.T
  elif t == "heads_in":   # [E, H, D] -> [H*D, E]
    out = x.reshape(x.shape[0], -1).T
  elif t == "heads_out":  # [H, D, E] -> [E, H*D]
    out = x.reshape(-1, x.shape[-1]).T
  elif t == "heads_bias":
    out = x.reshape(-1)
  elif t == "conv":   # [K, C] -> [C, 1, K]
    out = x.T[:, None, :]
  else:
    raise ValueError(f"unknown transform {t!r} for {entry.nnx}")
  return out


def to_hf(named: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
          config: ModelConfig, *, partial: bool = False) -> Iterator[tuple[str, np.ndarray]]:
  """Streams (hf_name, array) in HF / vLLM layout from NNX (path, array) pairs: host views of
  the arrays, transposed where HF's layout is (no copy beyond the host transfer), so not
  necessarily C-contiguous.

  Every table entry must be present and nothing else: a missing or unknown NNX path is an error
  (a silently skipped weight would leave vLLM serving stale values). `partial=True` streams a
  subset (a LoRA merge refit sends only the projections it touched); unknown paths still fail.
  """
  named = dict(named)
  entries = table(config)
  known = {e.nnx for e in entries}
  unknown = sorted(set(named) - known)
  if unknown:
    raise KeyError(f"NNX parameters with no HF name in the {config.family} table: {unknown[:5]}")
  for e in entries:
    if e.nnx not in named:
      if partial:
        continue
      raise KeyError(f"NNX parameter {e.nnx!r} (HF {e.hf!r}) is missing")
    x = named[e.nnx]
    # An expert slice is taken before the host copy: one expert's tensor crosses at a time.
    yield e.hf, nnx_to_hf_array(e, np.asarray(x[e.expert] if e.expert >= 0 else x))


def from_hf(hf_tensors: Mapping[str, np.ndarray], config: ModelConfig) -> dict[str, np.ndarray]:
  """Maps an HF state dict (name -> array) to NNX paths; missing HF tensors are an error.

  An `lm_head.weight` in a tied checkpoint is ignored (some exporters write it anyway).
  """
  out = {}
  entries = table(config)
  missing = [e.hf for e in entries if e.hf not in hf_tensors]
  if missing:
    raise KeyError(f"checkpoint lacks {len(missing)} tensors the {config.family} model needs, "
                   f"e.g. {missing[:3]}")
  known = {e.hf for e in entries} | {"lm_head.weight"}
  extra = sorted(n for n in hf_tensors if n not in known and "rotary_emb" not in n
                 and not (config.family == "qwen3_next" and n.startswith("mtp.")))
  if extra:
    raise KeyError(f"checkpoint has tensors the {config.family} model does not use: {extra[:5]}")
  slices: dict[str, dict[int, np.ndarray]] = {}
  for e in entries:
    x = hf_to_nnx_array(e, np.asarray(hf_tensors[e.hf]))
    if e.expert >= 0:
      slices.setdefault(e.nnx, {})[e.expert] = x
    else:
      out[e.nnx] = x
  for path, by_expert in slices.items():
    out[path] = np.stack([by_expert[j] for j in range(len(by_expert))])
  return out


# --- LoRA adapters (dockyard.models.lora): which tensors they touch, and PEFT's names ----------

PEFT_PREFIX = "base_model.model."


def lora_entries(config: ModelConfig, targets: Iterable[str]) -> list[Entry]:
  """The table entries of the projections LoRA wraps (`targets`, e.g. 'q_proj'): the only
  tensors a LoRA step changes, so the only ones a merge-mode refit sends."""
  suffixes = tuple(f".{t}.kernel" for t in targets)
  return [e for e in table(config) if e.nnx.startswith("layers.") and e.nnx.endswith(suffixes)]


def adapter_paths(entry: Entry) -> tuple[str, str]:
  """The NNX paths of the adapter on `entry`'s kernel: ('...q_proj.lora.lora_a', '...lora_b')."""
  stem = entry.nnx.removesuffix(".kernel")
  return f"{stem}.lora.lora_a", f"{stem}.lora.lora_b"


def peft_names(entry: Entry) -> tuple[str, str]:
  """PEFT's (and so vLLM's LoRA loader's) tensor names of the adapter on `entry`'s weight."""
  stem = PEFT_PREFIX + entry.hf.removesuffix(".weight")
  return f"{stem}.lora_A.weight", f"{stem}.lora_B.weight"


def adapter_to_peft(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """NNX adapter factors -> PEFT's lora_A [rank, in] and lora_B [out, rank].

  NNX keeps a as [*kernel input dims, rank] and b as [rank, *kernel output dims], so the HF
  flattening of the kernel (heads-major, as `nnx_to_hf_array` does) is a plain reshape."""
  rank = a.shape[-1]
  return (np.ascontiguousarray(np.asarray(a).reshape(-1, rank).T),
          np.ascontiguousarray(np.asarray(b).reshape(rank, -1).T))

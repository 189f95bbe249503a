"""The Flax NNX decoder for the Qwen2 / Qwen3 / Llama / Qwen3-MoE / Gemma 3 (text) / Qwen3-Next family.

RMSNorm, RoPE (default / linear / llama3 scaling), grouped-query attention, SwiGLU, Qwen2's q/k/v
bias, Qwen3's q/k norm, tied or untied embeddings, Qwen3-MoE's sparse layers (`MoE`: top-k
routing, experts as a grouped GEMM), Gemma 3's pieces (scaled embeddings, (1 + w) RMSNorm, four
norms per layer, GeGLU, query_pre_attn_scalar, sliding-window layers with their own RoPE base),
Qwen3-Next's (Gated DeltaNet layers, `GatedDeltaNet`, with the delta rule of
`dockyard.trainer_jax.gated_deltanet`; full attention with an output gate and partial RoPE;
sparse blocks with a shared expert); all chosen by `ModelConfig`. Parameters carry logical axis names only ('vocab', 'embed', 'mlp',
'heads', 'expert'); the mesh and the rules that map them to devices are applied at the edge
(`dockyard.trainer_jax.sharding`). The parameter paths here are the left column of
`dockyard.models.name_map`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dockyard.models.model_config import ModelConfig
from dockyard.trainer_jax import context_parallel
from dockyard.trainer_jax import gated_deltanet

_INIT = nnx.initializers.normal(0.02)


def _param(rngs: nnx.Rngs, shape, axes, dtype, init=_INIT) -> nnx.Param:
  return nnx.Param(nnx.with_partitioning(init, axes)(rngs.params(), shape, dtype))


class RMSNorm(nnx.Module):
  """`plus_one` (Gemma): scales by (1 + scale), scale initialised to 0, the product taken in fp32
  before the cast back (as transformers' Gemma3RMSNorm); otherwise by scale, in x's dtype."""

  def __init__(self, dim: int, eps: float, *, param_dtype, rngs: nnx.Rngs, plus_one: bool = False):
    # Norm scales are tiny: replicate them rather than pay a gather per layer.
    init = nnx.initializers.zeros_init() if plus_one else nnx.initializers.ones_init()
    self.scale = _param(rngs, (dim,), (None,), param_dtype, init)
    self.eps = eps
    self.plus_one = plus_one

  def __call__(self, x):
    dtype = x.dtype
    x = x.astype(jnp.float32)  # statistics in fp32, as transformers does
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    if self.plus_one:
      return (x * (1.0 + self.scale.astype(jnp.float32))).astype(dtype)
    return self.scale.astype(dtype) * x.astype(dtype)


def flat_matmul(x, w):
  """x [..., din] @ w [din, dout] as one 2-D matmul over the flattened leading dims. Same numbers
  as `x @ w`; XLA:CPU computes the weight gradient of the 3-D form from a transposed copy of dY in
  a slower dot (a 135M layer's forward + backward 104 -> 79 ms: docs/trainer_speed.md)."""
  return (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], w.shape[-1])


class HeadsProj(nnx.Module):
  """x [..., embed] -> [..., heads, head_dim]; kernel [embed, heads, head_dim]."""

  def __init__(self, embed, heads, head_dim, bias, *, dtype, param_dtype, rngs):
    self.kernel = _param(rngs, (embed, heads, head_dim), ("embed", "heads", None), param_dtype)
    self.bias = (_param(rngs, (heads, head_dim), ("heads", None), param_dtype, nnx.initializers.zeros_init())
                 if bias else None)
    self.dtype = dtype
    self.lora = None  # a trainer_jax.lora.LoRAAdapter when LoRA targets this projection

  def __call__(self, x):
    e, h, d = self.kernel.shape
    y = flat_matmul(x, self.kernel.astype(self.dtype).reshape(e, h * d)).reshape(*x.shape[:-1], h, d)
    if self.lora is not None:
      y = y + self.lora(x)
    return y + self.bias.astype(self.dtype) if self.bias is not None else y


class OutProj(nnx.Module):
  """[..., heads, head_dim] -> [..., embed]; kernel [heads, head_dim, embed]."""

  def __init__(self, heads, head_dim, embed, bias, *, dtype, param_dtype, rngs):
    self.kernel = _param(rngs, (heads, head_dim, embed), ("heads", None, "embed"), param_dtype)
    self.bias = _param(rngs, (embed,), (None,), param_dtype, nnx.initializers.zeros_init()) if bias else None
    self.dtype = dtype
    self.lora = None  # a trainer_jax.lora.LoRAAdapter when LoRA targets this projection

  def __call__(self, x):
    h, d, e = self.kernel.shape
    y = flat_matmul(x.reshape(*x.shape[:-2], h * d), self.kernel.astype(self.dtype).reshape(h * d, e))
    if self.lora is not None:
      y = y + self.lora(x)
    return y + self.bias.astype(self.dtype) if self.bias is not None else y


class Dense(nnx.Module):
  def __init__(self, din, dout, axes, bias, *, dtype, param_dtype, rngs):
    self.kernel = _param(rngs, (din, dout), axes, param_dtype)
    self.bias = _param(rngs, (dout,), (axes[1],), param_dtype, nnx.initializers.zeros_init()) if bias else None
    self.dtype = dtype
    self.lora = None  # a trainer_jax.lora.LoRAAdapter when LoRA targets this projection

  def __call__(self, x):
    y = flat_matmul(x, self.kernel.astype(self.dtype))
    if self.lora is not None:
      y = y + self.lora(x)
    return y + self.bias.astype(self.dtype) if self.bias is not None else y


def rope_cos_sin(positions, inv_freq):
  """cos/sin [B, T, head_dim] for positions [B, T] (fp32, HF's rotate-half layout)."""
  freqs = positions[..., None].astype(jnp.float32) * inv_freq[None, None, :]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x, cos, sin):
  """x [B, T, H, D]; rotate-half RoPE as in transformers' Llama/Qwen. cos/sin narrower than D
  (Qwen3-Next's partial RoPE) turn the first cos.shape[-1] dimensions; the rest pass through."""
  rot = cos.shape[-1]
  if rot < x.shape[-1]:
    return jnp.concatenate([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], axis=-1)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


ATTN_CHUNK = 128   # query block of the banded packed attention


def _local_window(sliding_window: int):
  """A sliding window of W keys (the query's own included: transformers' `kv_idx > q_idx - W`)
  as `jax.nn.dot_product_attention`'s (left, right) `local_window_size`: W - 1 keys to the left."""
  return (sliding_window - 1, 0) if sliding_window else None


def segment_attention(q, k, v, segment_ids, window: int | None, *, scale: float | None = None,
                      sliding_window: int = 0):
  """Causal attention within segments of packed rows: q [B, L, H, D], k/v [B, L, K, D] (GQA),
  segment_ids [B, L]. `window` (static): no segment is longer than this. Then each block of
  ATTN_CHUNK queries needs only the keys of its own and the previous ceil(window / ATTN_CHUNK)
  blocks, so the cost grows as L x window, not L^2 (XLA has no segment-skipping kernel: a full
  [L, L] mask computes every cross-segment block and throws it away). Exact: the keys left out are
  all in other segments. Falls back to the full same-segment mask when banding would not help.
  `scale`: the logits' scale (None: D**-0.5); `sliding_window` > 0: a query sees only the last
  that many keys of its segment, itself included (segments are contiguous, so the distance in the
  row is the distance in the segment), which also bounds the band."""
  b, l, h, d = q.shape
  kh = k.shape[2]
  if sliding_window:
    window = min(int(window or l), sliding_window)
  w = -(-int(window or l) // ATTN_CHUNK)
  if window is None or l % ATTN_CHUNK or (w + 1) * ATTN_CHUNK >= l:
    mask = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=True,
                                        local_window_size=_local_window(sliding_window))
  n, pad = l // ATTN_CHUNK, w * ATTN_CHUNK
  # Key block i covers padded positions [i * C, i * C + (w + 1) * C): the query block's own keys
  # and the w blocks before it (the left padding has segment -1, matching nothing).
  idx = jnp.arange(n)[:, None] * ATTN_CHUNK + jnp.arange((w + 1) * ATTN_CHUNK)[None, :]
  widths = ((0, 0), (pad, 0), (0, 0), (0, 0))
  kw, vw = jnp.pad(k, widths)[:, idx], jnp.pad(v, widths)[:, idx]          # [B, n, M, K, D]
  seg_k = jnp.pad(segment_ids, ((0, 0), (pad, 0)), constant_values=-1)[:, idx]   # [B, n, M]
  seg_q = segment_ids.reshape(b, n, ATTN_CHUNK)
  q_pos = jnp.arange(l).reshape(n, ATTN_CHUNK) + pad
  ok = (seg_q[..., :, None] == seg_k[..., None, :]) & (idx[None, :, None, :] <= q_pos[None, :, :, None])
  if sliding_window:
    ok = ok & (q_pos[None, :, :, None] - idx[None, :, None, :] < sliding_window)
  qc = q.reshape(b, n, ATTN_CHUNK, kh, h // kh, d)
  logits = jnp.einsum("bnckgd,bnmkd->bnkgcm", qc, kw, preferred_element_type=jnp.float32)
  logits = logits / jnp.sqrt(jnp.float32(d)) if scale is None else logits * jnp.float32(scale)
  logits = jnp.where(ok[:, :, None, None], logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  return jnp.einsum("bnkgcm,bnmkd->bnckgd", probs, vw).reshape(b, l, h, d)


class Attention(nnx.Module):
  """`sliding`: this layer sees only the last `c.sliding_window` keys (Gemma 3's local layers).
  `c.attn_output_gate` (Qwen3-Next): q_proj's heads are [query | gate], 2 x head_dim wide, and the
  attention's output is scaled by sigmoid(gate) before o_proj."""

  def __init__(self, c: ModelConfig, *, dtype, param_dtype, rngs, sliding: bool = False):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.output_gate = c.attn_output_gate
    q_width = c.head_dim * (2 if c.attn_output_gate else 1)
    self.q_proj = HeadsProj(c.hidden_size, c.num_heads, q_width, c.qkv_bias, **kw)
    self.k_proj = HeadsProj(c.hidden_size, c.num_kv_heads, c.head_dim, c.qkv_bias, **kw)
    self.v_proj = HeadsProj(c.hidden_size, c.num_kv_heads, c.head_dim, c.qkv_bias, **kw)
    self.o_proj = OutProj(c.num_heads, c.head_dim, c.hidden_size, c.o_bias, **kw)
    if c.qk_norm:
      norm = dict(param_dtype=param_dtype, rngs=rngs, plus_one=c.norm_plus_one)
      self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **norm)
      self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **norm)
    else:
      self.q_norm = self.k_norm = None
    self.num_kv_heads, self.head_dim = c.num_kv_heads, c.head_dim
    self.logit_scale = c.attn_scale   # None: head_dim**-0.5
    self.sliding_window = c.sliding_window if sliding else 0
    # A `context_parallel.SeqParallel` when a 'sequence' mesh axis splits the tokens (set by
    # `context_parallel.enable`); None: attention over the whole row on each device.
    self.seq_parallel = None

  def __call__(self, x, cos, sin, lengths, segments=None):
    q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    gate = None
    if self.output_gate:
      q, gate = q[..., :self.head_dim], q[..., self.head_dim:]
    if self.q_norm is not None:  # Qwen3 normalizes per head before RoPE
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if self.seq_parallel is not None:   # tokens split over 'sequence': all-gathered K/V per block
      out = context_parallel.attention(self.seq_parallel, q, k, v, lengths,
                                       None if segments is None else segments[0],
                                       scale=self.logit_scale, sliding_window=self.sliding_window)
    elif segments is not None:  # packed rows: (segment_ids, window)
      out = segment_attention(q, k, v, *segments, scale=self.logit_scale, sliding_window=self.sliding_window)
    else:
      # Causal + per-row key lengths (right padding) instead of a materialised [B, T, T] mask:
      # the form cuDNN's fused attention accepts on GPU; on CPU this is XLA's reference kernel.
      out = jax.nn.dot_product_attention(q, k, v, scale=self.logit_scale, is_causal=True,
                                         key_value_seq_lengths=lengths,
                                         local_window_size=_local_window(self.sliding_window))
    if gate is not None:
      out = out * jax.nn.sigmoid(gate)
    return self.o_proj(out)


class GatedRMSNorm(nnx.Module):
  """Qwen3-Next's gated norm of the delta rule's output, per value head: scale * rms_norm(x) *
  silu(gate), the statistics and the gate in fp32 (transformers' Qwen3NextRMSNormGated). Its
  scale initialises to 1 (not zero-centred like the model's other norms)."""

  def __init__(self, dim: int, eps: float, *, param_dtype, rngs: nnx.Rngs):
    self.scale = _param(rngs, (dim,), (None,), param_dtype, nnx.initializers.ones_init())
    self.eps = eps

  def __call__(self, x, gate):
    dtype = x.dtype
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    y = self.scale.astype(dtype) * xf.astype(dtype)
    return (y * jax.nn.silu(gate.astype(jnp.float32))).astype(dtype)


class GatedDeltaNet(nnx.Module):
  """Qwen3-Next's linear-attention layer: in_proj_qkvz / in_proj_ba -> causal depthwise conv over
  q/k/v (+ SiLU) -> the gated delta rule (`gated_deltanet.chunked_delta_rule`), with decay
  g = -exp(A_log) * softplus(a + dt_bias) and write strength beta = sigmoid(b) per value head ->
  gated RMSNorm (gate z) -> out_proj.

  The input projections keep HF's grouping by key head: for each of the nk key heads,
  in_proj_qkvz emits [q (dk) | k (dk) | v (r*dv) | z (r*dv)] and in_proj_ba [b (r) | a (r)], where
  r = nv / nk value heads share that key head; so their kernels are [embed, nk, width]
  (`HeadsProj`, the name map's `heads_in`). The conv kernel is [width, channels] over the
  channels [q (nk*dk) | k (nk*dk) | v (nv*dv)]."""

  def __init__(self, c: ModelConfig, *, dtype, param_dtype, rngs):
    nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
    dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
    r = nv // nk
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.in_proj_qkvz = HeadsProj(c.hidden_size, nk, 2 * dk + 2 * r * dv, False, **kw)
    self.in_proj_ba = HeadsProj(c.hidden_size, nk, 2 * r, False, **kw)
    channels = 2 * nk * dk + nv * dv
    self.conv1d = _param(rngs, (c.linear_conv_kernel, channels), (None, None), param_dtype)
    self.dt_bias = _param(rngs, (nv,), (None,), param_dtype, nnx.initializers.ones_init())
    # A = 4 at init (transformers draws A from U(0.01, 16)); a checkpoint brings its own.
    self.A_log = _param(rngs, (nv,), (None,), param_dtype, nnx.initializers.constant(float(np.log(4.0))))
    self.norm = GatedRMSNorm(dv, c.rms_norm_eps, param_dtype=param_dtype, rngs=rngs)
    self.out_proj = OutProj(nv, dv, c.hidden_size, False, **kw)
    self.nk, self.nv, self.dk, self.dv = nk, nv, dk, dv
    self.dtype = dtype

  def __call__(self, x, cos, sin, lengths, segments=None):
    """x [B, T, embed]; cos/sin unused (no RoPE here); `lengths` [B]: right padding, whose tokens
    are zeroed first (as transformers does); packed `segments` are refused (see gated_deltanet)."""
    if segments is not None:
      raise ValueError("Gated DeltaNet layers do not take packed rows (the recurrence would carry "
                       "state across segments): qwen3_next needs policy.packing_row_tokens=0")
    b, t, _ = x.shape
    nk, nv, dk, dv, r = self.nk, self.nv, self.dk, self.dv, self.nv // self.nk
    if lengths is not None:
      x = x * (jnp.arange(t)[None, :] < lengths[:, None])[..., None].astype(x.dtype)
    qkvz = self.in_proj_qkvz(x)                                     # [B, T, nk, 2dk + 2r dv]
    q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
    v = qkvz[..., 2 * dk:2 * dk + r * dv].reshape(b, t, nv, dv)
    z = qkvz[..., 2 * dk + r * dv:].reshape(b, t, nv, dv)
    ba = self.in_proj_ba(x)                                         # [B, T, nk, 2r]
    beta = jax.nn.sigmoid(ba[..., :r].reshape(b, t, nv))
    a = ba[..., r:].reshape(b, t, nv)
    mixed = jnp.concatenate([q.reshape(b, t, -1), k.reshape(b, t, -1), v.reshape(b, t, -1)], axis=-1)
    mixed = jax.nn.silu(gated_deltanet.causal_conv1d(mixed, self.conv1d[...].astype(self.dtype)))
    q = mixed[..., :nk * dk].reshape(b, t, nk, dk)
    k = mixed[..., nk * dk:2 * nk * dk].reshape(b, t, nk, dk)
    v = mixed[..., 2 * nk * dk:].reshape(b, t, nv, dv)
    g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
        a.astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32))
    if r > 1:   # each key head serves its r value heads (adjacent, as HF groups them)
      q, k = jnp.repeat(q, r, axis=2), jnp.repeat(k, r, axis=2)
    out, _ = gated_deltanet.chunked_delta_rule(q, k, v, g, beta)
    return self.out_proj(self.norm(out, z))


class MLP(nnx.Module):
  def __init__(self, c: ModelConfig, *, dtype, param_dtype, rngs, intermediate_size: int | None = None):
    kw = dict(bias=c.mlp_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    f = intermediate_size or c.intermediate_size
    self.gate_proj = Dense(c.hidden_size, f, ("embed", "mlp"), **kw)
    self.up_proj = Dense(c.hidden_size, f, ("embed", "mlp"), **kw)
    self.down_proj = Dense(f, c.hidden_size, ("mlp", "embed"), **kw)
    self.hidden_act = c.hidden_act

  def __call__(self, x):
    gate = self.gate_proj(x)
    if self.hidden_act == "gelu_pytorch_tanh":   # GeGLU (Gemma): torch's tanh-approximated GELU
      gate = jax.nn.gelu(gate, approximate=True)
    else:
      gate = jax.nn.silu(gate)
    return self.down_proj(gate * self.up_proj(x))


class RouterStats(nnx.Variable):
  """What a sparse layer's router did in its last forward pass (sums over the real tokens):
  read by `dockyard.trainer_jax.moe` for the aux losses and load metrics; never trained or exported."""


class ExpertBias(nnx.Variable):
  """Aux-loss-free balancing (DeepSeek-V3): a per-expert bias added to the routing scores for the
  top-k choice only (the mixing weights stay unbiased). Updated from the load after each step by
  `dockyard.trainer_jax.moe.update_expert_bias`, not by the optimizer; checkpointed, not exported."""


class MoE(nnx.Module):
  """Qwen3-MoE's sparse block: softmax router -> top-k experts (SwiGLU each), mixed by the
  (optionally renormalised) router probabilities. Dropless: every token reaches its k experts.

  The experts run as a grouped GEMM: the token-expert pairs are sorted by expert and each of the
  three projections is one `jax.lax.ragged_dot` over the contiguous groups. Expert kernels are
  [experts, in, out] with the logical axis 'expert' first, so an expert mesh axis splits them
  (XLA partitions `ragged_dot` along its group dimension: each device runs its own experts).
  Qwen3-Next adds a shared expert (a SwiGLU every token takes) scaled by sigmoid(shared_expert_gate(x)).
  """

  def __init__(self, c: ModelConfig, *, dtype, param_dtype, rngs):
    e, d, f = c.num_experts, c.hidden_size, c.moe_intermediate_size
    self.router = Dense(d, e, ("embed", None), False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.gate_proj = _param(rngs, (e, d, f), ("expert", "embed", "mlp"), param_dtype)
    self.up_proj = _param(rngs, (e, d, f), ("expert", "embed", "mlp"), param_dtype)
    self.down_proj = _param(rngs, (e, f, d), ("expert", "mlp", "embed"), param_dtype)
    self.expert_bias = ExpertBias(jnp.zeros((e,), jnp.float32))
    # Statistics of the last call (fixed shapes: overwriting them never changes the graph).
    self.load = RouterStats(jnp.zeros((e,), jnp.float32))       # token-expert assignments
    self.prob_sum = RouterStats(jnp.zeros((e,), jnp.float32))   # router probabilities summed
    self.z_sum = RouterStats(jnp.zeros((), jnp.float32))        # logsumexp(router logits)^2 summed
    self.tokens = RouterStats(jnp.zeros((), jnp.float32))       # real tokens routed
    self.top_k, self.norm_topk_prob, self.num_experts = c.num_experts_per_tok, c.norm_topk_prob, e
    self.dtype = dtype
    if c.shared_expert_intermediate_size:
      self.shared_expert = MLP(c, dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                               intermediate_size=c.shared_expert_intermediate_size)
      self.shared_expert_gate = Dense(d, 1, ("embed", None), False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    else:
      self.shared_expert = self.shared_expert_gate = None

  def __call__(self, x, token_mask):
    """x [B, T, embed]; token_mask [B, T] (1 = a real token: only those count in the statistics)."""
    b, t, d = x.shape
    xf = x.reshape(b * t, d)
    logits = self.router(xf).astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    # The bias steers which experts are chosen, never how much they weigh (and takes no gradient).
    scores = probs + jax.lax.stop_gradient(self.expert_bias[...])[None, :]
    _, idx = jax.lax.top_k(scores, self.top_k)                        # [N, k]
    weights = jnp.take_along_axis(probs, idx, axis=-1)
    if self.norm_topk_prob:
      weights = weights / weights.sum(axis=-1, keepdims=True)

    flat = idx.reshape(-1)                                            # [N*k] expert of each pair
    order = jnp.argsort(flat, stable=True)
    token = order // self.top_k
    sizes = jnp.bincount(flat, length=self.num_experts).astype(jnp.int32)
    xs = xf[token]
    gate = jax.lax.ragged_dot(xs, self.gate_proj[...].astype(self.dtype), sizes)
    up = jax.lax.ragged_dot(xs, self.up_proj[...].astype(self.dtype), sizes)
    ys = jax.lax.ragged_dot(jax.nn.silu(gate) * up, self.down_proj[...].astype(self.dtype), sizes)
    ys = ys * weights.reshape(-1)[order][:, None].astype(ys.dtype)
    out = jnp.zeros_like(xf).at[token].add(ys)
    if self.shared_expert is not None:
      out = out + jax.nn.sigmoid(self.shared_expert_gate(xf)) * self.shared_expert(xf)

    valid = token_mask.reshape(-1).astype(jnp.float32)
    self.load[...] = jnp.zeros((self.num_experts,), jnp.float32).at[idx].add(
        jnp.broadcast_to(valid[:, None], idx.shape))
    self.prob_sum[...] = (probs * valid[:, None]).sum(axis=0)
    self.z_sum[...] = (jax.nn.logsumexp(logits, axis=-1) ** 2 * valid).sum()
    self.tokens[...] = valid.sum()
    return out.reshape(b, t, d)


class DecoderLayer(nnx.Module):
  """Pre-norm block. With `c.sandwich_norms` (Gemma) `post_attn_norm` normalises the attention's
  output before the residual add, and `pre_ffw_norm` / `post_ffw_norm` wrap the MLP the same way;
  otherwise `post_attn_norm` is the MLP's input norm (HF's `post_attention_layernorm` either way).
  A Qwen3-Next linear layer has `linear_attn` (a `GatedDeltaNet`) where the others have `attn`."""

  def __init__(self, c: ModelConfig, *, dtype, param_dtype, rngs, index: int = 0):
    def norm():
      return RMSNorm(c.hidden_size, c.rms_norm_eps, param_dtype=param_dtype, rngs=rngs, plus_one=c.norm_plus_one)
    self.input_norm = norm()
    if index in c.linear_layers:
      self.attn, self.linear_attn = None, GatedDeltaNet(c, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    else:
      self.attn = Attention(c, dtype=dtype, param_dtype=param_dtype, rngs=rngs, sliding=index in c.sliding_layers)
      self.linear_attn = None
    self.post_attn_norm = norm()
    sparse = index in c.moe_layers
    self.mlp = (MoE if sparse else MLP)(c, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    if c.sandwich_norms:
      self.pre_ffw_norm, self.post_ffw_norm = norm(), norm()
    else:
      self.pre_ffw_norm = self.post_ffw_norm = None

  def __call__(self, x, cos, sin, lengths, segments=None):
    if self.pre_ffw_norm is not None:   # Gemma's sandwich (dense MLP only: no Gemma MoE exists)
      x = x + self.post_attn_norm(self.attn(self.input_norm(x), cos, sin, lengths, segments))
      return x + self.post_ffw_norm(self.mlp(self.pre_ffw_norm(x)))
    mixer = self.attn if self.attn is not None else self.linear_attn
    x = x + mixer(self.input_norm(x), cos, sin, lengths, segments)
    h = self.post_attn_norm(x)
    if isinstance(self.mlp, MoE):  # the router's statistics count real tokens only
      real = (segments[0] > 0 if segments is not None      # packed rows: segment 0 is padding
              else jnp.arange(x.shape[1])[None, :] < lengths[:, None])
      return x + self.mlp(h, real)
    return x + self.mlp(h)


class Decoder(nnx.Module):
  """Causal LM: token ids [B, T] -> fp32 logits [B, T, vocab].

  `attention_mask` must be right padding (ones, then zeros), as `dockyard.policy.TrainBatch` is.
  Packed rows (`dockyard.packing`) pass `segment_ids` [B, T] (a token attends only to earlier
  tokens of its own segment) and `positions` that restart at 0 in each segment instead, and may
  bound the segments' length by a static `window` (see `segment_attention`).
  """

  def __init__(self, c: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32, remat: bool = False,
               rngs: nnx.Rngs):
    self.config = c
    self.dtype = dtype
    self.remat = remat
    self.embed = nnx.Embed(c.vocab_size, c.hidden_size, dtype=dtype, param_dtype=param_dtype,
                           embedding_init=nnx.with_partitioning(_INIT, ("vocab", "embed")), rngs=rngs)
    self.layers = nnx.List([DecoderLayer(c, dtype=dtype, param_dtype=param_dtype, rngs=rngs, index=i)
                            for i in range(c.num_layers)])
    self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, param_dtype=param_dtype, rngs=rngs,
                              plus_one=c.norm_plus_one)
    self.lm_head = (None if c.tie_word_embeddings else
                    Dense(c.hidden_size, c.vocab_size, ("embed", "vocab"), False, dtype=dtype,
                          param_dtype=param_dtype, rngs=rngs))
    self.inv_freq = nnx.Variable(jnp.asarray(c.inv_freq()))  # a constant, not a Param: never trained
    # The sliding-window layers' own RoPE frequencies (Gemma 3: base rope_local_theta, unscaled).
    self.inv_freq_local = nnx.Variable(jnp.asarray(c.inv_freq(local=True))) if c.sliding_layers else None

  def __call__(self, input_ids, attention_mask=None, positions=None, segment_ids=None,
               window: int | None = None):
    return self.logits(self.hidden_states(input_ids, attention_mask, positions, segment_ids, window))

  def logits(self, x):
    """The LM head (tied: the embedding's transpose) on hidden states [..., hidden]; fp32."""
    if self.lm_head is None:
      logits = flat_matmul(x, self.embed.embedding[...].astype(self.dtype).T)
    else:
      logits = self.lm_head(x)
    return logits.astype(jnp.float32)

  def hidden_states(self, input_ids, attention_mask=None, positions=None, segment_ids=None,
                    window: int | None = None):
    """The final-norm hidden states [B, T, hidden] the LM head reads (a reward model's score
    head reads them too, `dockyard.trainer_jax.reward_model`); arguments as `__call__`."""
    b, t = input_ids.shape
    if positions is None:  # right padding: real tokens sit at 0..len-1
      positions = jnp.broadcast_to(jnp.arange(t)[None, :], (b, t))
    segments = lengths = None
    if segment_ids is not None:
      if attention_mask is not None:
        raise ValueError("packed rows take segment_ids, not an attention_mask")
      segments = (segment_ids, window)
    else:
      if attention_mask is None:
        attention_mask = jnp.ones((b, t), jnp.int32)
      lengths = attention_mask.astype(jnp.int32).sum(axis=-1)
    rope = rope_cos_sin(positions, self.inv_freq[...])
    local = rope_cos_sin(positions, self.inv_freq_local[...]) if self.inv_freq_local is not None else None
    x = self.embed(input_ids)
    c = self.config
    if c.embed_scale:  # Gemma: times sqrt(hidden_size), rounded to the compute dtype first (as HF)
      x = x * jnp.asarray(np.float32(c.hidden_size ** 0.5), x.dtype)

    def layer_fn(layer, x, cos, sin):
      return layer(x, cos, sin, lengths, segments)
    if self.remat:  # recompute each layer's activations in the backward pass to save memory
      layer_fn = nnx.remat(layer_fn)
    for i, layer in enumerate(self.layers):
      x = layer_fn(layer, x, *(local if i in c.sliding_layers else rope))
    return self.final_norm(x)


def token_logprobs(logits, input_ids):
  """Per-token logprobs [B, T]: entry t = log p(x_t | x_<t) from logits[t-1]; entry 0 = 0."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  picked = jnp.take_along_axis(logp, input_ids[:, 1:, None], axis=-1)[..., 0]
  return jnp.concatenate([jnp.zeros_like(picked[:, :1]), picked], axis=1)


def gathered_logprobs(logits, ids):
  """[B, T, K]: entry (t, j) = log p(ids[t, j] | x_<t) from logits[t-1]; entry 0 = 0 (the
  top-k contract of `dockyard.policy`)."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  picked = jnp.take_along_axis(logp, ids[:, 1:].astype(jnp.int32), axis=-1)
  return jnp.concatenate([jnp.zeros_like(picked[:, :1]), picked], axis=1)


def top_k_logprobs(logits, k: int):
  """(ids [B, T, k] int32, logprobs [B, T, k]): the k most likely next tokens from logits[t-1]
  at entry t, most likely first; entry 0 is 0."""
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  values, ids = jax.lax.top_k(logp, k)
  pad = lambda x: jnp.concatenate([jnp.zeros_like(x[:, :1]), x], axis=1)
  return pad(ids.astype(jnp.int32)), pad(values)

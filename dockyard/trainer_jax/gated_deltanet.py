"""The gated delta rule of Qwen3-Next's Gated DeltaNet layers, in JAX: a chunked form that the
model runs (`chunked_delta_rule`: dense work inside chunks of `CHUNK` tokens, `jax.lax.scan` over
the chunks for the state) and a token-by-token reference (`recurrent_delta_rule`: `jax.lax.scan`
over tokens) that the chunked form is tested against; plus the causal depthwise convolution the
layer applies to q/k/v first. Pure functions; the layer (`model.GatedDeltaNet`) owns the weights.

The recurrence, per head, state S [dk, dv], for tokens t = 1..T with (after L2-normalising q and
k and scaling q by dk**-0.5):
    S   <- exp(g_t) S                       (g_t <= 0: the gate's decay, in log space)
    u_t  = beta_t (v_t - S^T k_t)           (the delta rule: write what S gets wrong about k_t)
    S   <- S + k_t u_t^T
    o_t  = S^T q_t
Inside a chunk with cumulative log decay c_i = g_1 + .. + g_i and entry state S0, every u_i
depends on S0 and on the earlier u_j of the chunk linearly:
    u_i + sum_{j<i} beta_i exp(c_i - c_j) (k_i . k_j) u_j = beta_i v_i - beta_i exp(c_i) S0^T k_i,
a unit lower-triangular system (I + A) U = B V - diag(B e^c) K S0, solved once per chunk for
both right-hand sides (W = (I + A)^-1 B V and Y = (I + A)^-1 diag(B e^c) K, independent of S0, so
all chunks at once); then U = W - Y S0, and
    o_i   = exp(c_i) S0^T q_i + sum_{j<=i} exp(c_i - c_j) (q_i . k_j) u_j
    S_end = exp(c_C) S0 + sum_j exp(c_C - c_j) k_j u_j^T.
Only the last two lines carry the state, so only they are in the scan.

Right padding is what the decoder uses: padded tokens come after a row's real ones, so neither the
causal convolution nor the recurrence lets them reach a real token. Packed rows (several sequences
in one row) would need the state and the convolution reset at each boundary: not implemented, and
`dockyard.validate` refuses packing for this family.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

CHUNK = 64   # tokens per chunk (transformers' and FLA's default)


def l2norm(x, eps: float = 1e-6):
  """x / sqrt(sum x^2 + eps) over the last axis (FLA's and transformers' form)."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_conv1d(x, kernel):
  """Depthwise causal convolution: x [B, T, C], kernel [K, C] -> [B, T, C], where output t mixes
  inputs t-K+1 .. t of its own channel (zeros before the row starts); tap K-1 is the current token."""
  width = kernel.shape[0]
  xp = jnp.pad(x, ((0, 0), (width - 1, 0), (0, 0)))
  t = x.shape[1]
  return sum(xp[:, j:j + t, :] * kernel[j].astype(x.dtype) for j in range(width))


def _prepare(q, k, v, g, beta):
  """[B, T, H, *] -> fp32, heads first ([B, H, T, *]); q, k L2-normalised, q scaled by dk**-0.5."""
  q, k = l2norm(q.astype(jnp.float32)), l2norm(k.astype(jnp.float32))
  q = q * (q.shape[-1] ** -0.5)
  heads_first = lambda x: jnp.moveaxis(x.astype(jnp.float32), 2, 1)
  return heads_first(q), heads_first(k), heads_first(v), heads_first(g), heads_first(beta)


def recurrent_delta_rule(q, k, v, g, beta, initial_state=None):
  """The reference: one token at a time. q, k [B, T, H, dk]; v [B, T, H, dv]; g, beta [B, T, H].
  Returns (o [B, T, H, dv] in v's dtype, final state [B, H, dk, dv] fp32)."""
  dtype = v.dtype
  q, k, v, g, beta = _prepare(q, k, v, g, beta)
  b, h, _, dk = q.shape
  state = jnp.zeros((b, h, dk, v.shape[-1]), jnp.float32) if initial_state is None else initial_state

  def step(s, xs):
    q_t, k_t, v_t, g_t, beta_t = xs
    s = s * jnp.exp(g_t)[..., None, None]
    u = beta_t[..., None] * (v_t - jnp.einsum("bhkv,bhk->bhv", s, k_t))
    s = s + k_t[..., None] * u[..., None, :]
    return s, jnp.einsum("bhkv,bhk->bhv", s, q_t)

  time_first = lambda x: jnp.moveaxis(x, 2, 0)
  state, out = jax.lax.scan(step, state, tuple(map(time_first, (q, k, v, g, beta))))
  return jnp.moveaxis(out, 0, 2).swapaxes(1, 2).astype(dtype), state


def chunked_delta_rule(q, k, v, g, beta, initial_state=None, chunk: int = CHUNK):
  """The same result as `recurrent_delta_rule`, computed chunk-parallel (see the module doc)."""
  dtype = v.dtype
  q, k, v, g, beta = _prepare(q, k, v, g, beta)
  b, h, t, dk = q.shape
  dv = v.shape[-1]
  pad = -t % chunk   # padded tokens: beta = 0 (no write), g = 0 (no decay); they come last
  if pad:
    q, k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, v))
    g, beta = (jnp.pad(x, ((0, 0), (0, 0), (0, pad))) for x in (g, beta))
  n = (t + pad) // chunk
  q, k, v = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
  g, beta = (x.reshape(b, h, n, chunk) for x in (g, beta))

  c = jnp.cumsum(g, axis=-1)                                   # [B, H, N, C]
  causal = jnp.tril(jnp.ones((chunk, chunk), bool))            # j <= i
  # exp(c_i - c_j) for j <= i, 0 above the diagonal (masked before exp: c_i - c_j > 0 there).
  decay = jnp.exp(jnp.where(causal, c[..., :, None] - c[..., None, :], -jnp.inf))
  kk = jnp.einsum("bhnid,bhnjd->bhnij", k, k)
  a = jnp.where(jnp.tril(causal, -1), beta[..., :, None] * kk * decay, 0.0)   # strictly lower
  eye = jnp.eye(chunk, dtype=jnp.float32)
  rhs = jnp.concatenate([beta[..., None] * v, (beta * jnp.exp(c))[..., None] * k], axis=-1)
  solved = jax.lax.linalg.triangular_solve(eye + a, rhs, left_side=True, lower=True, unit_diagonal=True)
  w, y = solved[..., :dv], solved[..., dv:]                    # U = W - Y S0
  qk = jnp.einsum("bhnid,bhnjd->bhnij", q, k) * decay          # intra-chunk, j <= i
  q_decayed = q * jnp.exp(c)[..., None]                         # reads S0
  k_to_end = k * jnp.exp(c[..., -1:] - c)[..., None]            # writes into S_end
  chunk_decay = jnp.exp(c[..., -1])                             # [B, H, N]

  def step(s, xs):
    w_n, y_n, qk_n, qd_n, ke_n, cd_n = xs
    u = w_n - jnp.einsum("bhck,bhkv->bhcv", y_n, s)
    o = jnp.einsum("bhck,bhkv->bhcv", qd_n, s) + jnp.einsum("bhij,bhjv->bhiv", qk_n, u)
    s = s * cd_n[..., None, None] + jnp.einsum("bhck,bhcv->bhkv", ke_n, u)
    return s, o

  state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state
  chunk_first = lambda x: jnp.moveaxis(x, 2, 0)
  state, out = jax.lax.scan(step, state, tuple(map(chunk_first, (w, y, qk, q_decayed, k_to_end, chunk_decay))))
  out = jnp.moveaxis(out, 0, 2).reshape(b, h, n * chunk, dv)[:, :, :t]
  return out.swapaxes(1, 2).astype(dtype), state

"""The optimizer and the jitted train / logprob steps (free functions, as in Flax's examples).

`train_step(model, optimizer, batch, loss_fn)` splits nothing itself: `batch` arrives already
stacked as micro-batches [n_cap, micro_bs, T] (the policy does this on the host, so each micro-
batch keeps the batch sharding), a `lax.fori_loop` over the first `num_micro` of them (a traced
count: a step that keeps fewer groups, e.g. under dynamic sampling, does not recompile and computes
nothing for the padding micro-batches) sums loss, gradients and metrics per the LossFn contract in
`dockyard/policy.py`, then one AdamW update applies. A packed batch (`dockyard.packing`) stacks
packed rows instead and scores them with `packed_logprobs` before the same loss. Model and optimizer are
donated: their old buffers are reused for the new state.

Token-budget micro-batches (`optim.micro_batch_tokens`) each have their own shape, so the policy
runs them through a host-side accumulation loop instead: `micro_batch_grads` per micro-batch (the
same micro-batch function as `train_step`'s, `_micro_grads`), `accumulate`, then `apply_grads`
(the same update, `_finish`).
"""
from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from dockyard.trainer_jax import moe as moe_lib
from dockyard.trainer_jax.model import Decoder, gathered_logprobs, token_logprobs, top_k_logprobs


def lr_schedule(optim: Mapping[str, Any], total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to `lr`, then cosine decay to `lr * end_lr_factor`."""
  decay = int(optim["decay_steps"]) or int(total_steps)
  warmup = int(optim["warmup_steps"])
  if decay <= warmup:
    raise ValueError(f"optim.decay_steps ({decay}; 0 means the run's step count) must exceed "
                     f"optim.warmup_steps ({warmup})")
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=float(optim["lr"]), warmup_steps=warmup, decay_steps=decay,
      end_value=float(optim["lr"]) * float(optim["end_lr_factor"]))


def make_tx(optim: Mapping[str, Any], total_steps: int) -> optax.GradientTransformation:
  """Global-norm clipping + AdamW on the schedule. `lr_override` >= 0 replaces the schedule
  (the SFT warm start runs at its own constant rate); steps taken under an override do not
  advance the schedule (`schedule_offset` counts them), so GRPO after a warm start begins at the
  schedule's step 0. Both live in the optimizer state: changing them neither recompiles nor
  loses Adam's moments, and checkpoints carry them."""
  schedule = lr_schedule(optim, total_steps)

  def build(lr_override, schedule_offset, override_start):
    del override_start   # bookkeeping for set_lr_override; not used by the update

    def lr(count):
      return jnp.where(lr_override >= 0, lr_override, schedule(count - schedule_offset))
    return optax.chain(
        optax.clip_by_global_norm(float(optim["max_grad_norm"])),
        optax.adamw(lr, b1=float(optim["b1"]), b2=float(optim["b2"]), eps=float(optim["eps"]),
                    weight_decay=float(optim["weight_decay"])),
    )
  return optax.inject_hyperparams(build)(
      lr_override=-1.0, schedule_offset=np.zeros((), np.int32), override_start=np.zeros((), np.int32))


def make_optimizer(model: Decoder, optim: Mapping[str, Any], total_steps: int, mesh=None,
                   wrt=nnx.Param) -> nnx.Optimizer:
  """AdamW state beside the model; moments inherit the parameters' shardings, and scalars (step,
  count, lr override) are replicated onto `mesh` so that every step sees the same input types
  (an uncommitted scalar on the first call would otherwise cost a second compile). `wrt` picks
  what trains: every `nnx.Param`, or `nnx.LoRAParam` alone under LoRA (moments for the adapters
  only; `train_step` differentiates what the optimizer holds)."""
  optimizer = nnx.Optimizer(model, make_tx(optim, total_steps), wrt=wrt)
  if mesh is not None:
    replicated = NamedSharding(mesh, P())
    state = nnx.state(optimizer)
    state = jax.tree.map(
        lambda x: x if isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
        else jax.device_put(x, replicated), state)
    nnx.update(optimizer, state)
  return optimizer


def _hyper(optimizer: nnx.Optimizer, name: str):
  return optimizer.opt_state.hyperparams[name]


def current_lr(optimizer: nnx.Optimizer, optim: Mapping[str, Any], total_steps: int) -> float:
  """The rate the next step will use: the override, or the schedule at (step - schedule_offset)."""
  override = float(_hyper(optimizer, "lr_override")[...])
  if override >= 0:
    return override
  count = int(optimizer.step[...]) - int(_hyper(optimizer, "schedule_offset")[...])
  return float(lr_schedule(optim, total_steps)(count))


def _set_hyper(optimizer: nnx.Optimizer, name: str, value) -> None:
  var = _hyper(optimizer, name)
  old = var.get_value()
  # Same dtype and placement as before, so the jitted step sees an identical input type.
  var.set_value(jax.device_put(np.asarray(value, old.dtype), old.sharding))


def set_lr_override(optimizer: nnx.Optimizer, lr: float | None) -> None:
  """A constant rate (None: back to the schedule). The steps taken under it are added to
  `schedule_offset` when it is lifted, so they do not count as schedule steps."""
  step = int(optimizer.step[...])
  active = float(_hyper(optimizer, "lr_override")[...]) >= 0
  if lr is not None and not active:
    _set_hyper(optimizer, "override_start", step)
  elif lr is None and active:
    offset = int(_hyper(optimizer, "schedule_offset")[...])
    _set_hyper(optimizer, "schedule_offset", offset + step - int(_hyper(optimizer, "override_start")[...]))
  _set_hyper(optimizer, "lr_override", -1.0 if lr is None else float(lr))


def _tree_add(a, b):
  return jax.tree.map(jnp.add, a, b)


# A packed micro-batch (dockyard.packing.PackedMicro): rows [R, L] and the gather back to [S, T].
PACKED_KEYS = ("input_ids", "positions", "segment_ids", "gather", "valid")


def packed_logprobs(model: Decoder, mb: Mapping[str, Any], temperature=1.0):
  """Logprobs [S, T] of a packed micro-batch's sequences: the model runs on the packed rows
  (segment-masked attention, per-segment positions); each sequence's entries are gathered from
  its row by flat index, 0 where `valid` is 0 (entry 0 and padding). No sequence is longer than
  the gathered T, which bounds the attention band (`model.segment_attention`)."""
  logits = model(mb["input_ids"], positions=mb["positions"], segment_ids=mb["segment_ids"],
                 window=mb["gather"].shape[-1])
  rows = token_logprobs(logits / temperature, mb["input_ids"])
  return jnp.take(rows.reshape(-1), mb["gather"], axis=0) * mb["valid"]


def windowed_logprobs(model: Decoder, mb: Mapping[str, Any], temperature=1.0):
  """Logprobs [R, T] like `token_logprobs` of the full logits, but the LM head and its
  log-softmax over the vocabulary run only at `mb['head_window']` [R, K]: per row K distinct
  positions >= 1 that cover every position its loss reads (`JaxPolicy._head_window`); 0 elsewhere.
  At prompt positions nothing reads a logprob, and on a small model the head is much of the step
  (SmolLM2-135M: 28M of 135M parameters over a 49,152-token vocabulary)."""
  ids, pos = mb["input_ids"], mb["head_window"]
  h = model.hidden_states(ids, mb["attention_mask"])
  h = jnp.take_along_axis(h, (pos - 1)[..., None], axis=1)          # position t reads hidden t-1
  logp = jax.nn.log_softmax(model.logits(h) / temperature, axis=-1)
  picked = jnp.take_along_axis(logp, jnp.take_along_axis(ids, pos, axis=1)[..., None], axis=-1)[..., 0]
  rows = jnp.arange(ids.shape[0])[:, None]
  return jnp.zeros(ids.shape, picked.dtype).at[rows, pos].set(picked, unique_indices=True)


def _micro_grads(graphdef, rest, loss_fn, moe: moe_lib.MoEOptions, sparse: bool, totals,
                 temperature, num_micro):
  """`summed(params, rngs, mb) -> (((loss, (metrics, router)), grads), rngs)`: one micro-batch's
  loss, metrics, router statistics and gradients wrt `params` (what the optimizer trains), and the
  advanced random streams. Shared by the stacked `train_step` and the token-budget path
  (`micro_batch_grads`), so both compute the same function of a micro-batch.

  mb: input_ids / attention_mask [R, T] (or packed PACKED_KEYS), loss_mask [R, T] / [S, T],
  extras name -> [R, ...]; totals: the whole batch's {'total_tokens', 'total_sequences'};
  num_micro: the step's count of real micro-batches (each one's router loss counts 1/num_micro).
  """
  def micro_loss(params, rngs, mb):
    # Fresh Variables for the dropout streams at this trace level (grad passes non-differentiated
    # arguments through as they are, and a Variable is mutable only where it was made); copy:
    # fresh Variables in this trace for everything, which the sparse layers' router statistics
    # are written to and which `nnx.remat` writes back after each layer (a frozen LoRA base left
    # in `rest` would otherwise be a Variable of the outer trace: TraceContextError).
    rngs = jax.tree.map(lambda x: x, rngs)
    m = nnx.merge(graphdef, params, rngs, rest, copy=True)
    m.train()  # this traced copy only: LoRA dropout on; `model` itself stays deterministic
    extras = {**mb["extras"], **totals}
    if "segment_ids" in mb:   # packed rows: score them, then gather back to [S, T] (sequences)
      logprobs = packed_logprobs(m, mb, temperature)
    elif "head_window" in mb:   # the head only where the loss reads (never with top-k extras)
      logprobs = windowed_logprobs(m, mb, temperature)
    else:
      logits = m(mb["input_ids"], mb["attention_mask"]) / temperature
      logprobs = token_logprobs(logits, mb["input_ids"])
      if "topk_ids" in extras:   # the top-k contract of dockyard.policy
        extras["topk_logprobs"] = gathered_logprobs(logits, extras["topk_ids"])
    loss, metrics = loss_fn(logprobs, mb["loss_mask"], extras)
    metrics = dict(metrics)
    streams = nnx.state(m, nnx.RngState)
    if not sparse:
      return loss, (metrics, {}, streams)
    stats = moe_lib.router_stats(m)
    aux, z = moe_lib.aux_loss(stats), moe_lib.z_loss(stats)
    # Each micro-batch's router loss counts 1/num_micro: the step optimises their mean.
    loss = loss + (moe.aux_loss_coef * aux + moe.z_loss_coef * z) / num_micro
    metrics.update(moe_aux_loss=jax.lax.stop_gradient(aux) / num_micro,
                   moe_z_loss=jax.lax.stop_gradient(z) / num_micro)
    return loss, (metrics, {"load": jax.lax.stop_gradient(stats["load"])}, streams)

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def summed(params, rngs, mb):  # ((loss, aux), grads) to accumulate, and the advanced streams
    (loss, (metrics, router, rngs)), grads = grad_fn(params, rngs, mb)
    return ((loss, (metrics, router)), grads), rngs
  return summed


def _finish(model: Decoder, optimizer: nnx.Optimizer, grads, metrics, router, loss, moe):
  """The step's end, given the micro-batches' sums: one optimizer update (its global-norm clip
  sees the accumulated gradient), the expert load metrics and the balancing-bias update."""
  grad_norm = optax.global_norm(grads)
  optimizer.update(model, grads)
  metrics = dict(metrics)
  if model.config.is_moe:
    metrics.update(moe_lib.load_metrics(router["load"]))
    if moe.bias_update_rate > 0:
      moe_lib.update_expert_bias(model, router["load"], moe.bias_update_rate)
  return {**metrics, "loss": loss, "grad_norm": grad_norm}


@functools.partial(nnx.jit, static_argnames=("loss_fn", "moe"), donate_argnums=(0, 1))
def train_step(model: Decoder, optimizer: nnx.Optimizer, batch: Mapping[str, Any], loss_fn,
               moe: moe_lib.MoEOptions = moe_lib.MoEOptions()):
  """One optimizer step over stacked micro-batches; returns summed loss/metrics + grad_norm.

  batch: input_ids / attention_mask / loss_mask [n, mb, T]; extras: name -> [n, mb, ...];
  optionally head_window [n, mb, K] (`windowed_logprobs`); or,
  packed, PACKED_KEYS (rows [n, R, L], gather / valid [n, S, T]) with loss_mask [n, S, T] and
  extras [n, S, ...] laid out by sequence;
  totals: {'total_tokens', 'total_sequences'} scalars added to every micro-batch's extras;
  temperature (optional, default 1): a scalar array; the loss sees logprobs of logits / T;
  num_micro (optional, default n): an int32 scalar, how many of the n micro-batches are real (the
  rest are padding that is never computed).
  A Mixture-of-Experts model adds its router losses (weighted by `moe`, averaged over the
  micro-batches) to the loss, reports them and its expert load, and updates its balancing bias
  (`dockyard.trainer_jax.moe`).
  """
  # Differentiate what the optimizer trains (all Params, or the LoRA adapters alone); the random
  # streams (LoRA dropout; empty otherwise) are carried through the micro-batches so each draws
  # fresh masks, and written back so the next step does too.
  graphdef, params, rngs, rest = nnx.split(model, optimizer.wrt, nnx.RngState, ...)
  temperature = batch.get("temperature", 1.0)
  num_micro = batch.get("num_micro", batch["input_ids"].shape[0])
  summed = _micro_grads(graphdef, rest, loss_fn, moe, model.config.is_moe, batch["totals"],
                        temperature, num_micro)

  keys = PACKED_KEYS if "segment_ids" in batch else ("input_ids", "attention_mask") + (
      ("head_window",) if "head_window" in batch else ())
  micro = {k: batch[k] for k in keys + ("loss_mask", "extras")}
  first = jax.tree.map(lambda x: x[0], micro)
  out_shape = jax.eval_shape(summed, params, rngs, first)[0]
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape)

  def body(i, carry):
    acc, rngs = carry
    mb = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), micro)
    out, rngs = summed(params, rngs, mb)
    return _tree_add(acc, out), rngs

  ((loss, (metrics, router)), grads), rngs = jax.lax.fori_loop(0, num_micro, body, (zeros, rngs))
  nnx.update(model, rngs)
  return _finish(model, optimizer, grads, metrics, router, loss, moe)


# --- token-budget micro-batches: a gradient-accumulation loop on the host -----------------------
#
# With `optim.micro_batch_tokens` the micro-batches differ in shape (each padded to its own
# longest sequence), so they cannot be stacked into one scan. The policy runs them one by one:
# `micro_batch_grads` (compiled once per (rows, length) bucket) for each, `accumulate` to sum
# them, then `apply_grads` (one compile) for the update. Same `_micro_grads` function and same
# `_finish` as `train_step`, so the step is the same function of the batch.

@functools.partial(jax.jit, static_argnames=("graphdef", "loss_fn", "moe", "sparse"))
def micro_batch_grads(graphdef, params, rngs, rest, mb, totals, temperature, num_micro, *,
                      loss_fn, moe: moe_lib.MoEOptions, sparse: bool):
  """One unstacked micro-batch (input_ids / attention_mask / loss_mask [R, T], extras [R, ...]):
  (((loss, (metrics, router)), grads), advanced rngs), from `nnx.split(model, optimizer.wrt,
  nnx.RngState, ...)`'s pieces."""
  summed = _micro_grads(graphdef, rest, loss_fn, moe, sparse, totals, temperature, num_micro)
  return summed(params, rngs, mb)


# Sums a micro-batch's outputs into the running total (whose buffers are reused).
accumulate = jax.jit(_tree_add, donate_argnums=0)


@functools.partial(nnx.jit, static_argnames=("moe",), donate_argnums=(0, 1, 2))
def apply_grads(model: Decoder, optimizer: nnx.Optimizer, grads, rngs, metrics, router, loss,
                moe: moe_lib.MoEOptions = moe_lib.MoEOptions()):
  """The token-budget step's end: the advanced random streams back into the model, then
  `train_step`'s update on the accumulated sums. Returns the step's metrics."""
  nnx.update(model, rngs)
  return _finish(model, optimizer, grads, metrics, router, loss, moe)


@nnx.jit
def logprob_step(model: Decoder, input_ids, attention_mask, temperature=1.0):
  """Per-token logprobs under softmax(logits / temperature) (a traced scalar: no recompile per T)."""
  return token_logprobs(model(input_ids, attention_mask) / temperature, input_ids)


@nnx.jit
def packed_logprob_step(model: Decoder, mb, temperature=1.0):
  """`packed_logprobs` of one packed micro-batch (PACKED_KEYS), jitted."""
  return packed_logprobs(model, mb, temperature)


@functools.partial(nnx.jit, static_argnames=("k",))
def topk_logprob_step(model: Decoder, input_ids, attention_mask, temperature, k: int):
  """`top_k_logprobs` of softmax(logits / temperature): (ids, logprobs) [B, T, k]."""
  return top_k_logprobs(model(input_ids, attention_mask) / temperature, k)

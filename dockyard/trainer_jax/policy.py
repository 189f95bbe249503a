"""`JaxPolicy`: the `Policy` seam implemented with the NNX decoder on a device mesh.

Host side of the trainer: takes NumPy `TrainBatch`es, pads them to length buckets (multiples of
`bucket`, so the jit cache is hit step after step) and to whole micro-batches, stacks them as
[n_cap, micro_bs, T] (n_cap: the micro-batch count rounded up to a power of two, so batches of
varying size, e.g. under dynamic sampling, share a few compiled steps; the step computes only the
real micro-batches) with the batch dimension sharded over the 'batch' rule's mesh axes, and
calls the jitted `train_step`. Weights leave through the refit name-map in HF layout.

With `policy.packing_row_tokens` > 0 the batch's sequences are packed first-fit decreasing into
rows of that fixed length (`dockyard.packing`), `micro_batch_size` rows a micro-batch, and the
step runs the model on the packed rows (segment-masked attention, per-segment positions) and
gathers the logprobs back to each sequence before the unchanged loss fn. Shapes stay few: the
row length is the constant budget, the micro-batch count and the sequences per micro-batch are
rounded up to powers of two, the gathered length to `bucket`.

With `optim.micro_batch_tokens` > 0 (unpacked rows) the micro-batches are planned by token budget
instead, as the torch trainer plans them (`packing.token_budget_groups`, on the lengths rounded up
to `bucket`): whole sequences, longest first, as many a micro-batch as keep rows x padded length
<= the budget, each micro-batch padded only to its own longest (rounded up to `bucket`). A full
micro-batch has budget // length rows, the last one its count rounded up to a power of two (rows
of padding, masked), so the compiled shapes are about one per length bucket. They run through a
host-side gradient-accumulation loop (`train.micro_batch_grads` per micro-batch, compiled once per
shape; `train.accumulate`; one `train.apply_grads`): the same micro-batch function and update as
the stacked step, with the whole batch's totals, so the step equals the fixed-size one.
"""
from __future__ import annotations

import math
import os
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dockyard import config_lib, packing
from dockyard.policy import LossFn, Policy, TrainBatch, check_layout
from dockyard.models import name_map
from dockyard.models.lora import LoRAConfig, check_matches as check_lora_matches, write_peft_adapter
from dockyard.trainer_jax import context_parallel, hf_io, lora, quant, train
from dockyard.trainer_jax import moe as moe_lib
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.checkpoint import Checkpointer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _dtype(name: str, key: str):
  if name not in DTYPES:
    raise ValueError(f"config.{key}={name!r}: expected one of {sorted(DTYPES)}")
  return DTYPES[name]


def _get(config, path: str, default):
  node = config
  for part in path.split("."):
    if node is None or part not in node:
      return default
    node = node[part]
  return node


class JaxPolicy(Policy):
  def __init__(self, model, optimizer, mesh, rules, optim: Mapping[str, Any], total_steps: int,
               *, micro_batch_size: int, bucket: int = 64, source_dir: str | None = None,
               packing_row_tokens: int = 0, moe: moe_lib.MoEOptions = moe_lib.MoEOptions(),
               lora_config: LoRAConfig | None = None, head_window: int = 0):
    """`head_window` > 0: train steps run the LM head on that many positions of a row where
    its loss positions fit (`_head_window`); 0: everywhere."""
    self.model, self.optimizer, self.mesh, self.rules = model, optimizer, mesh, tuple(rules)
    self.head_window = int(head_window)
    self.lora_config = lora_config
    self.optim, self.total_steps = dict(optim), int(total_steps)
    self.micro_batch_size, self.bucket, self.source_dir = int(micro_batch_size), int(bucket), source_dir
    self.moe = moe
    self.packing_row_tokens = int(packing_row_tokens)
    self.micro_batch_tokens = int(self.optim.get("micro_batch_tokens", 0))
    if self.packing_row_tokens and self.micro_batch_tokens:
      raise ValueError("config.policy.packing_row_tokens and config.optim.micro_batch_tokens are both "
                       "set: packed micro-batches are already budgeted in tokens (micro_batch_size "
                       "rows x packing_row_tokens); set one")
    seq = context_parallel.axis_size(mesh)
    for key, length in (("policy.seq_bucket", self.bucket),
                        ("policy.packing_row_tokens", self.packing_row_tokens)):
      if length % seq:
        raise ValueError(f"config.{key}={length} must be a multiple of the mesh's 'sequence' axis "
                         f"({seq}), which splits each row's tokens")
    batch_axes = shd.batch_axis_size(mesh, self.rules)
    if self.micro_batch_size % batch_axes:
      raise ValueError(f"config.optim.micro_batch_size={self.micro_batch_size} must be a multiple of "
                       f"the mesh's batch axes size ({batch_axes}), which split each micro-batch")
    self._checkpointers: dict[str, Checkpointer] = {}

  @classmethod
  def from_hf(cls, path: str, config, mesh=None, devices=None) -> "JaxPolicy":
    """Builds from an HF directory with `config` (the experiment ConfigDict: policy/mesh/optim)."""
    if mesh is None:
      if devices is None and jax.default_backend() == "cpu":
        # As `dockyard.validate` counts them: a CPU trainer has `cluster.cpu_devices` devices.
        n = int(_get(config, "cluster.cpu_devices", 0)) or jax.device_count()
        if n > jax.device_count():
          raise ValueError(f"config.cluster.cpu_devices={n}, but JAX has {jax.device_count()} CPU devices "
                           f"(XLA_FLAGS=--xla_force_host_platform_device_count={n} before JAX starts)")
        devices = jax.devices()[:n]
      mesh = shd.make_mesh(tuple(config.mesh.shape), tuple(config.mesh.axes), devices)
    rules = tuple((name, tuple(t) if isinstance(t, list) else t) for name, t in config.mesh.rules)
    dtype = _dtype(config.policy.dtype, "policy.dtype")
    param_dtype = _dtype(config.policy.param_dtype, "policy.param_dtype")
    model = hf_io.from_hf(path, mesh, rules, dtype=dtype, param_dtype=param_dtype,
                          remat=bool(config.policy.remat))
    total = config_lib.train_steps(config) or int(config.optim.decay_steps)
    lora_config = LoRAConfig.from_config(config)
    if lora_config is not None:  # adapters on the frozen base; the optimizer holds them alone
      lora.attach(model, lora_config, mesh, rules, seed=int(_get(config, "run.seed", 0)))
      if lora_config.base_quant != "none":   # QLoRA: the frozen base held int8 / NF4
        quant.quantize_base(model, lora_config.base_quant, mesh, rules)
    context_parallel.enable(model, context_parallel.make(mesh, rules))   # no-op without 'sequence'
    optimizer = train.make_optimizer(model, config.optim, total, mesh,
                                     wrt=nnx.Param if lora_config is None else lora.ADAPTER_FILTER)
    return cls(model, optimizer, mesh, rules, config.optim, total,
               micro_batch_size=int(config.optim.micro_batch_size),
               bucket=int(config.policy.seq_bucket), source_dir=path,
               packing_row_tokens=int(_get(config, "policy.packing_row_tokens", 0)),
               moe=moe_lib.MoEOptions.from_config(_get(config, "policy.moe", None)),
               lora_config=lora_config,
               # A completion's tokens are the positions a GRPO loss reads: one window size
               # for the whole run, so the window adds at most one compile per length bucket.
               head_window=int(_get(config, "rollout.max_new_tokens", 0)))

  # --- batches -------------------------------------------------------------------------------

  def _padded_len(self, t: int) -> int:
    return max(self.bucket, int(math.ceil(t / self.bucket)) * self.bucket)

  def _check(self, batch: TrainBatch) -> None:
    for name in ("attention_mask", "loss_mask"):
      if getattr(batch, name).shape != batch.input_ids.shape:
        raise ValueError(f"TrainBatch.{name} shape {getattr(batch, name).shape} != input_ids "
                         f"shape {batch.input_ids.shape}")
    check_layout(batch)
    for k, v in batch.extras.items():
      if np.ndim(v) == 0:
        raise ValueError("per-sequence extras must have a batch dimension")
      if np.shape(v)[0] != batch.batch_size:
        raise ValueError(f"an extras array has batch dimension {np.shape(v)[0]}, expected {batch.batch_size}")

  def _stack(self, batch: TrainBatch, mb: int | None = None) -> tuple[dict, int]:
    """Pads [B, T] to [n*mb, T'] and reshapes to [n, mb, T'], sharded on the batch dim; `mb`:
    rows per micro-batch (default the configured micro-batch size)."""
    self._check(batch)
    b, t = batch.input_ids.shape
    mb = mb or self.micro_batch_size
    n = max(1, math.ceil(b / mb))
    n_cap = 1 << (n - 1).bit_length()   # padding micro-batches: never computed (train.train_step)
    rows, cols = n_cap * mb - b, self._padded_len(t) - t

    def pad(x):
      x = np.asarray(x)
      if x.ndim == 0:
        raise ValueError("per-sequence extras must have a batch dimension")
      if x.shape[0] != b:
        raise ValueError(f"an extras array has batch dimension {x.shape[0]}, expected {b}")
      widths = [(0, rows)] + [(0, cols if (d == 1 and x.shape[1] == t) else 0) for d in range(1, x.ndim)]
      x = np.pad(x, widths)
      return x.reshape((n_cap, mb) + x.shape[1:])

    def put(x, tokens=False):   # tokens: [n, mb, T], T split over a 'sequence' axis if any
      return jax.device_put(x, shd.batch_sharding(self.mesh, self.rules, x.ndim, batch_dim=1,
                                                  token_dim=2 if tokens else None))
    replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    out = dict(
        # Replicated, like the optimizer's scalars: traced inputs, so a new T or count does not recompile.
        temperature=jax.device_put(np.float32(batch.temperature), replicated),
        num_micro=jax.device_put(np.int32(n), replicated),
        input_ids=put(pad(batch.input_ids).astype(np.int32), tokens=True),
        attention_mask=put(pad(batch.attention_mask).astype(np.int32), tokens=True),
        loss_mask=put(pad(batch.loss_mask).astype(np.float32), tokens=True),
        extras={k: put(pad(v)) for k, v in batch.extras.items()},
    )
    return out, b

  def _stack_packed(self, batch: TrainBatch) -> tuple[dict, list[np.ndarray]]:
    """Packs the batch (`dockyard.packing`) into [n, R, L] rows, sharded on R, and lays the
    sequences' loss masks and extras out as [n, S, T'] (replicated: the gather crosses rows);
    returns the stacked arrays and each real micro-batch's sequence indices."""
    self._check(batch)
    b, t = batch.input_ids.shape
    tb = self._padded_len(t)
    micros = packing.pack_micro_batches(batch, self.packing_row_tokens, self.micro_batch_size, seq_len=tb)
    n = len(micros)
    n_cap = 1 << (n - 1).bit_length()
    s_cap = 1 << (max(len(m.seqs) for m in micros) - 1).bit_length()

    def stack(arrays, shape, dtype):   # micro-batches (each padded to `shape`) -> [n_cap, *shape]
      out = np.zeros((n_cap,) + shape, dtype)
      for i, a in enumerate(arrays):
        out[(i,) + tuple(slice(0, d) for d in a.shape)] = a
      return out

    def by_seq(x):   # [B, ...] -> [n_cap, S_cap, ...]: each micro-batch's sequences, in its order
      x = np.asarray(x)
      shape = (s_cap,) + tuple(tb if (d == 1 and x.shape[1] == t) else x.shape[d] for d in range(1, x.ndim))
      return stack([x[m.seqs] for m in micros], shape, x.dtype)

    rows = (self.micro_batch_size, self.packing_row_tokens)
    sharded = lambda x: jax.device_put(x, shd.batch_sharding(self.mesh, self.rules, x.ndim, batch_dim=1,
                                                             token_dim=2))   # rows [n, R, L]
    replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    rep = lambda x: jax.device_put(x, replicated)
    out = dict(
        temperature=rep(np.float32(batch.temperature)),
        num_micro=rep(np.int32(n)),
        input_ids=sharded(stack([m.input_ids for m in micros], rows, np.int32)),
        positions=sharded(stack([m.positions for m in micros], rows, np.int32)),
        segment_ids=sharded(stack([m.segment_ids for m in micros], rows, np.int32)),
        gather=rep(stack([m.gather for m in micros], (s_cap, tb), np.int32)),
        valid=rep(stack([m.valid for m in micros], (s_cap, tb), np.float32)),
        loss_mask=rep(by_seq(np.asarray(batch.loss_mask, np.float32))),
        extras={k: rep(by_seq(v)) for k, v in batch.extras.items()},
    )
    return out, [m.seqs for m in micros]

  def _plan_budget(self, batch: TrainBatch) -> list[tuple[np.ndarray, int, int]]:
    """Token-budget micro-batches: (sequence indices, rows, length) each. Planned on the lengths
    rounded up to `bucket` (what each micro-batch is padded to), so rows x length <= the budget;
    a sequence whose rounded length alone passes the budget (but that itself fits) goes alone.
    A full micro-batch's rows are budget // length (a function of its length bucket), the last
    one's its count rounded up to a power of two (at most that); both rounded up to a multiple
    of the mesh's batch axes, which split them."""
    budget = self.micro_batch_tokens
    lengths = packing.seq_lengths(batch)
    bucketed = np.asarray([self._padded_len(int(n)) for n in lengths], np.int64)
    planned = np.maximum(lengths, np.minimum(bucketed, budget))
    axes = shd.batch_axis_size(self.mesh, self.rules)
    plan = []
    for group in packing.token_budget_groups(planned, budget):
      seqs = np.asarray(group, np.int64)
      length = int(bucketed[seqs].max())
      full = max(1, budget // length)
      rows = max(len(seqs), min(1 << (len(seqs) - 1).bit_length(), full))
      plan.append((seqs, -(-rows // axes) * axes, length))
    return plan

  def _budget_micro(self, batch: TrainBatch, seqs: np.ndarray, rows: int, length: int,
                    losses: bool = True) -> dict:
    """One token-budget micro-batch: the rows `seqs`, cut (or padded) to `length` tokens, padded
    with empty rows to `rows`; sharded like a stacked micro-batch."""
    t = batch.input_ids.shape[1]

    def take(x, dtype=None):
      x = np.asarray(x)[seqs]
      cols = 0
      if x.ndim >= 2 and x.shape[1] == t:   # token-aligned: this micro-batch's length
        x = x[:, :length]
        cols = length - x.shape[1]
      x = np.pad(x, [(0, rows - len(seqs)), *([(0, cols)] if x.ndim >= 2 else [])]
                 + [(0, 0)] * (x.ndim - 2))
      return x if dtype is None else x.astype(dtype)

    def put(x, tokens=False):
      return jax.device_put(x, shd.batch_sharding(self.mesh, self.rules, x.ndim, batch_dim=0,
                                                  token_dim=1 if tokens else None))
    mb = dict(input_ids=put(take(batch.input_ids, np.int32), tokens=True),
              attention_mask=put(take(batch.attention_mask, np.int32), tokens=True))
    if losses:
      mb.update(loss_mask=put(take(batch.loss_mask, np.float32), tokens=True),
                extras={k: put(take(v)) for k, v in batch.extras.items()})
    return mb

  def _train_step_budget(self, batch: TrainBatch, loss_fn: LossFn, totals) -> dict:
    """Token-budget micro-batches through the host-side accumulation loop (see the docstring)."""
    self._check(batch)
    plan = self._plan_budget(batch)
    replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    temperature = jax.device_put(np.float32(batch.temperature), replicated)
    num_micro = jax.device_put(np.int32(len(plan)), replicated)
    graphdef, params, rngs, rest = nnx.split(self.model, self.optimizer.wrt, nnx.RngState, ...)
    acc = None
    for seqs, rows, length in plan:
      out, rngs = train.micro_batch_grads(
          graphdef, params, rngs, rest, self._budget_micro(batch, seqs, rows, length), totals,
          temperature, num_micro, loss_fn=loss_fn, moe=self.moe, sparse=self.model.config.is_moe)
      acc = out if acc is None else train.accumulate(acc, out)
    (loss, (metrics, router)), grads = acc
    del params, rest   # their buffers are the model's, which the update donates
    return train.apply_grads(self.model, self.optimizer, grads, rngs, metrics, router, loss, self.moe)

  # --- Policy --------------------------------------------------------------------------------

  def logprobs(self, batch: TrainBatch) -> np.ndarray:
    if self.packing_row_tokens:
      stacked, seqs = self._stack_packed(batch)
      t = batch.input_ids.shape[1]
      out = np.zeros(batch.input_ids.shape, np.float32)
      for i, idx in enumerate(seqs):
        mb = {k: stacked[k][i] for k in train.PACKED_KEYS}
        lp = np.asarray(jax.device_get(train.packed_logprob_step(self.model, mb, stacked["temperature"])))
        out[idx] = lp[:len(idx), :t]
      return out
    if self.micro_batch_tokens:
      self._check(batch)
      t = batch.input_ids.shape[1]
      out = np.zeros(batch.input_ids.shape, np.float32)
      temperature = jax.device_put(np.float32(batch.temperature),
                                   jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec()))
      for seqs, rows, length in self._plan_budget(batch):
        mb = self._budget_micro(batch, seqs, rows, length, losses=False)
        lp = train.logprob_step(self.model, mb["input_ids"], mb["attention_mask"], temperature)
        n = min(length, t)
        out[seqs, :n] = np.asarray(jax.device_get(lp))[:len(seqs), :n]
      return out * np.asarray(batch.attention_mask, out.dtype)
    stacked, b = self._stack(batch, self._scoring_rows(batch.batch_size))
    t = batch.input_ids.shape[1]
    outs = [train.logprob_step(self.model, stacked["input_ids"][i], stacked["attention_mask"][i],
                               stacked["temperature"])
            for i in range(int(stacked["num_micro"]))]
    out = np.concatenate([np.asarray(jax.device_get(o)) for o in outs])[:b, :t]
    return out * np.asarray(batch.attention_mask, out.dtype)  # padding positions report 0

  def topk_logprobs(self, batch: TrainBatch, k: int) -> tuple[np.ndarray, np.ndarray]:
    # unpacked rows, whatever policy.packing_row_tokens says
    stacked, b = self._stack(batch, self._scoring_rows(batch.batch_size))
    t = batch.input_ids.shape[1]
    outs = [jax.device_get(train.topk_logprob_step(self.model, stacked["input_ids"][i],
                                                   stacked["attention_mask"][i], stacked["temperature"], int(k)))
            for i in range(int(stacked["num_micro"]))]
    mask = np.asarray(batch.attention_mask)[:, :, None]
    ids = np.concatenate([np.asarray(o[0]) for o in outs])[:b, :t] * mask
    lps = np.concatenate([np.asarray(o[1]) for o in outs])[:b, :t] * mask
    return ids.astype(np.int32), lps.astype(np.float32)

  def _scoring_rows(self, b: int) -> int:
    """Rows of a scoring micro-batch (`logprobs`, `topk_logprobs`): the micro-batch size, or for a
    smaller batch the next power of two at or above it (a multiple of the batch axis), so a small
    batch is not padded to a full micro-batch of rows that are all computed. The refit canary's
    2-row probe of SmolLM2 ran on 8 rows (540 ms a sync); on 2 it takes 164 ms. At most log2 of
    the micro-batch size more compiles of the scoring step, once each."""
    dp = shd.batch_axis_size(self.mesh, self.rules)
    rows = -(-max(dp, 1 << max(b - 1, 0).bit_length()) // dp) * dp
    return min(self.micro_batch_size, rows)

  def _head_window(self, batch: TrainBatch, shape) -> jax.Array | None:
    """Positions [n, mb, K] at which the train step runs the LM head (`train.windowed_logprobs`):
    per row K = `head_window` consecutive positions from its first loss position (moved left
    where the row's end would pass the padded length T; never 0). None, and the head runs
    everywhere, where a row's span from first to last loss position exceeds K (multi-turn
    episodes, long SFT targets), K exceeds T/2 (little to save), or the loss reads the full
    logits (top-k distillation extras). K is the run's, so a length bucket compiles at most two
    train steps per loss (the head on K positions, or on all)."""
    if "topk_ids" in batch.extras or self.head_window <= 0:
      return None
    n, mb, t = shape
    lm = np.asarray(batch.loss_mask) > 0
    has = lm.any(axis=1)
    if not has.any():
      return None
    first = np.where(has, lm.argmax(axis=1), 1)
    last = np.where(has, lm.shape[1] - 1 - lm[:, ::-1].argmax(axis=1), 1)
    k = self.head_window
    if int((last - first).max()) + 1 > k or 2 * k > t:
      return None
    starts = np.ones(n * mb, np.int64)                     # padding rows: any K distinct positions
    starts[:len(first)] = np.clip(first, 1, t - k)
    window = (starts[:, None] + np.arange(k)[None, :]).astype(np.int32).reshape(n, mb, k)
    return jax.device_put(window, shd.batch_sharding(self.mesh, self.rules, 3, batch_dim=1, token_dim=None))

  def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
    """One step; `loss_fn` is a jit static argument: pass the same callable each step."""
    if self.packing_row_tokens and "topk_ids" in batch.extras:
      raise ValueError("extras['topk_ids'] (top-k distillation) needs unpacked rows: set "
                       "config.policy.packing_row_tokens=0")
    loss_mask = np.asarray(batch.loss_mask, np.float32)
    replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    totals = jax.device_put(dict(
        total_tokens=np.float32(loss_mask.sum()),
        total_sequences=np.float32((loss_mask.sum(axis=1) > 0).sum())), replicated)
    lr = train.current_lr(self.optimizer, self.optim, self.total_steps)
    if self.micro_batch_tokens:
      metrics = self._train_step_budget(batch, loss_fn, totals)
    else:
      stacked, _ = self._stack_packed(batch) if self.packing_row_tokens else self._stack(batch)
      window = None if self.packing_row_tokens else self._head_window(batch, stacked["input_ids"].shape)
      if window is not None:
        stacked["head_window"] = window
      stacked["totals"] = totals
      metrics = train.train_step(self.model, self.optimizer, stacked, loss_fn, self.moe)
    out = {k: float(v) for k, v in jax.device_get(metrics).items()}
    out["lr"] = lr
    return out

  def named_weights(self, touched_only: bool = False) -> Iterator[tuple[str, np.ndarray]]:
    """HF-named weights, LoRA adapters merged. `touched_only`: under LoRA, only the adapted
    projections (`W + scale * B A`), the tensors a step can change; without LoRA, all."""
    # Device arrays go in; the name-map gathers one tensor at a time as it yields, so the host
    # never holds a second full copy of the model.
    if touched_only and self.lora_config is not None:
      yield from name_map.to_hf(lora.merged_kernels(self.model), self.model.config, partial=True)
      return
    yield from name_map.to_hf(hf_io.named_params(self.model), self.model.config)

  def save_hf(self, path: str, **kw) -> None:
    """An HF directory of the policy's weights (LoRA adapters merged into their projections)."""
    hf_io.save_hf(self.model, path, self.source_dir, **kw)

  def save_adapter(self, path: str) -> int:
    """The LoRA adapters as a PEFT adapter directory (what vLLM's LoRARequest loads); returns
    the bytes of its tensors."""
    if self.lora_config is None:
      raise ValueError("save_adapter needs LoRA (config.policy.lora.enabled=True)")
    return write_peft_adapter(path, lora.peft_tensors(self.model), self.lora_config)

  def checkpointer(self, directory: str) -> Checkpointer:
    """The (cached) manager of `directory`: it keeps the newest checkpoint."""
    key = os.path.abspath(directory)
    if key in self._checkpointers and not os.path.isdir(key):
      # Its directory was moved or removed (the GRPO loop renames latest.tmp -> latest): the
      # cached manager's list of steps is stale and its retention would try to delete them.
      del self._checkpointers[key]
    if key not in self._checkpointers:
      # Under LoRA a checkpoint holds the adapters (and their dropout streams), not the base.
      model_filter = ... if self.lora_config is None else nnx.Any(lora.ADAPTER_FILTER, nnx.RngState)
      self._checkpointers[key] = Checkpointer(directory, model_filter=model_filter)
    return self._checkpointers[key]

  def save(self, directory: str, *, data_iter=None) -> None:
    """Saves weights (under LoRA: the adapters alone), optimizer, step (+ the grain iterator) as
    `directory/<step>/`."""
    extra = {"lora": None if self.lora_config is None else self.lora_config.to_json()}
    self.checkpointer(directory).save(self.step, self.model, self.optimizer, data_iter=data_iter,
                                      extra=extra)

  def restore(self, directory: str, *, data_iter=None, step: int | None = None) -> dict:
    """Restores the newest checkpoint (or `step`) in place; returns its bookkeeping JSON. An
    adapter checkpoint loads onto a policy built from the same base with the same LoRA shapes."""
    ckpt = self.checkpointer(directory)
    check_lora_matches(ckpt.meta(step).get("lora"), self.lora_config, directory)
    return ckpt.restore(self.model, self.optimizer, step=step, data_iter=data_iter)

  @property
  def step(self) -> int:
    return int(self.optimizer.step[...])

  def set_lr(self, lr: float | None) -> None:
    """A constant learning rate (e.g. the SFT warm start's); None returns to the schedule."""
    if lr is not None and not (lr >= 0 and math.isfinite(lr)):
      raise ValueError(f"learning rate must be a finite number >= 0, got {lr}")
    train.set_lr_override(self.optimizer, lr)


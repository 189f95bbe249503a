"""`TorchPolicy`: the `dockyard.policy.Policy` seam on an HF transformers model under FSDP2.

Every decoder layer and then the root are wrapped with `fully_shard` on a 1-D 'fsdp' mesh, so
parameters are DTensors sharded (dim 0) over the ranks; one rank in a plain process, N under
`torchrun --nproc_per_node=N` (gloo on CPU, NCCL on GPU). The batch contract is in
`dockyard.trainer_torch.dist`: every rank passes the same global batch. The optimizer follows the
JAX trainer (`dockyard.trainer_torch.optim`); weights leave through the refit name-map
(`named_weights`); checkpoints are torch distributed checkpoints (`dockyard.trainer_torch.checkpoint`).

Micro-batches are `optim.micro_batch_size` rows by default. With `policy.packing_row_tokens` > 0
they are packed rows instead (`dockyard.packing`: first-fit decreasing, `micro_batch_size` rows of
at most that many tokens, trimmed to the longest): the model gets per-segment `position_ids` and no
attention mask, from which transformers builds the block-causal (same-segment) mask for sdpa and
eager attention; the logprobs are gathered back to each sequence before the unchanged loss fn.
With `optim.micro_batch_tokens` > 0 (unpacked) whole sequences are grouped, longest first, into
micro-batches of at most that many padded tokens. Either way micro-batch j of the global plan runs
on rank j % world.

A Mixture-of-Experts model (Qwen3-MoE) also returns its router logits in training forward passes,
and each micro-batch adds the router losses of `config.policy.moe` (`dockyard.trainer_torch.moe`:
the same terms and weights as the JAX trainer's). transformers keeps a sparse layer's experts fused
in memory; the name-map's `module_param` says which slice of them each checkpoint tensor is.
"""
from __future__ import annotations

import math
import os
import shutil
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from dockyard import config_lib, packing
from dockyard.policy import LossFn, Policy, TrainBatch, check_layout
from dockyard.models import name_map
from dockyard.models.model_config import ModelConfig  # pure Python: the name-map's config
from dockyard.models.lora import LoRAConfig, check_matches as check_lora_matches, write_peft_adapter
from dockyard.trainer_torch import checkpoint, dist, lora, moe, optim

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str, key: str) -> torch.dtype:
  if name not in DTYPES:
    raise ValueError(f"config.{key}={name!r}: expected one of {sorted(DTYPES)}")
  return DTYPES[name]


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
  """[B, T] with entry t = log p(x_t | x_<t) from logits[t-1]; entry 0 = 0 (as the JAX side)."""
  logp = F.log_softmax(logits[:, :-1].to(torch.float32), dim=-1)
  picked = logp.gather(-1, input_ids[:, 1:, None].long())[..., 0]
  return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def gathered_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
  """[B, T, K]: entry (t, j) = log p(ids[t, j] | x_<t) from logits[t-1]; entry 0 = 0 (the top-k
  contract of `dockyard.policy`)."""
  logp = F.log_softmax(logits[:, :-1].to(torch.float32), dim=-1)
  picked = logp.gather(-1, ids[:, 1:].long())
  return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def check_batch(batch: TrainBatch, vocab_size: int, max_seq_len: int) -> None:
  """Clear errors for malformed batches, before any collective starts."""
  ids = np.asarray(batch.input_ids)
  if ids.ndim != 2:
    raise ValueError(f"TrainBatch.input_ids must be [B, T], got shape {ids.shape}")
  for name in ("attention_mask", "loss_mask"):
    shape = np.shape(getattr(batch, name))
    if shape != ids.shape:
      raise ValueError(f"TrainBatch.{name} has shape {shape}, input_ids has {ids.shape}")
  check_layout(batch)
  if ids.shape[1] > max_seq_len:
    raise ValueError(f"batch length {ids.shape[1]} exceeds config.policy.max_seq_len={max_seq_len}")
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f"TrainBatch.input_ids out of range [0, {vocab_size}): min {ids.min()}, max {ids.max()}")
  for k, v in batch.extras.items():
    v = np.asarray(v)
    if v.ndim >= 1 and v.shape[0] != ids.shape[0]:
      raise ValueError(f"TrainBatch.extras[{k!r}] has {v.shape[0]} rows, the batch has {ids.shape[0]}")


class TorchPolicy(Policy):
  """An HF causal LM, FSDP2-sharded, trained with AdamW on a `LossFn`."""

  def __init__(self, model_path: str, config: Any):
    import transformers

    dist.ensure_process_group()
    self.config = config
    self.model_path = model_path
    self.model_config = ModelConfig.from_pretrained(model_path)  # refuses what the name-map lacks
    # None for a dense model; refuses what transformers' router cannot do (the balancing bias).
    self.router_loss = moe.RouterLoss.from_config(self.model_config, config.policy.get("moe"))
    self._optim = dict(config.optim)
    self._total_steps = int(config.optim.decay_steps) or config_lib.train_steps(config)
    self._max_seq_len = int(config.policy.max_seq_len)
    self._micro = int(config.optim.micro_batch_size)
    if self._micro < 1:
      raise ValueError(f"config.optim.micro_batch_size must be >= 1, got {self._micro}")
    self._packing_row_tokens = int(config.policy.get("packing_row_tokens", 0))
    self._micro_tokens = int(config.optim.get("micro_batch_tokens", 0))
    if self._packing_row_tokens and self._micro_tokens:
      raise ValueError("config.policy.packing_row_tokens and config.optim.micro_batch_tokens are both "
                       "set: packed micro-batches are already budgeted in tokens (micro_batch_size "
                       "rows x packing_row_tokens); set one")
    param_dtype = _dtype(config.policy.param_dtype, "policy.param_dtype")
    compute_dtype = _dtype(config.policy.dtype, "policy.dtype")
    optim.lr_at(0, self._optim, self._total_steps)  # fails early on a bad schedule
    torch.manual_seed(int(config.run.seed))

    self.device = torch.device(dist.device_type())
    # Only rank 0 reads the checkpoint; the others build on the meta device (no memory) and
    # receive their shards from rank 0 after sharding, so a host never holds N full copies.
    if dist.rank() == 0:
      model = transformers.AutoModelForCausalLM.from_pretrained(
          model_path, dtype=param_dtype, attn_implementation="sdpa").to(self.device)
      full_state = model.state_dict()  # the unsharded tensors, kept alive until broadcast
    else:
      hf_config = transformers.AutoConfig.from_pretrained(model_path)
      with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            hf_config, dtype=param_dtype, attn_implementation="sdpa")
      full_state = {}
    model.config.use_cache = False
    # HF builds the input embedding as nn.Embedding(padding_idx=config.pad_token_id), which drops
    # the lookup-side gradient of that row at every position. Where the pad id is a real token
    # (SmolLM2: pad = EOS = <|im_end|>, which ends every chat turn of a prompt) that is a wrong
    # gradient, and the JAX trainer's would differ; padding positions need no such help (right
    # padding: nothing downstream of them reaches the loss). So the row trains like any other.
    model.get_input_embeddings().padding_idx = None
    self.lora_config = LoRAConfig.from_config(config)
    if self.lora_config is not None:  # peft adapters in place, every other parameter frozen
      model = lora.inject(model, self.lora_config)
      if dist.rank() == 0:   # the adapters' initial values travel with the base from rank 0
        full_state = model.state_dict()
    if config.policy.remat:  # recompute each layer in the backward pass to save memory
      model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(use_reentrant=False))
    mesh = dist.fsdp_mesh()
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:  # one all-gather per layer, resharded after use
      fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    if dist.world_size() > 1:
      _broadcast_from_rank0(model, full_state, self.device)
    del full_state
    for module in model.modules():
      if hasattr(module, "set_gradient_divide_factor"):
        # The loss is already normalized by whole-batch totals: sum gradients over ranks (a
        # plain SUM: the PREMUL_SUM that a custom factor picks otherwise does not exist in gloo).
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    self.model = model
    self._check_names()
    # AdamW state for what trains: every parameter, or the LoRA adapters alone.
    self.optimizer = optim.make_optimizer([p for p in model.parameters() if p.requires_grad], self._optim)
    self._step = 0
    self._lr_override: float | None = None
    # Steps taken under an override do not advance the schedule (as in JaxPolicy): they are
    # added to the offset when the override is lifted.
    self._schedule_offset = 0
    self._override_start = 0
    self._checkpointers: dict[str, checkpoint.Checkpointer] = {}

  @classmethod
  def from_hf(cls, path: str, config: Any) -> "TorchPolicy":
    return cls(path, config)

  @property
  def step(self) -> int:
    return self._step

  def set_lr(self, lr: float | None) -> None:
    """A constant learning rate (e.g. the SFT warm start's); None returns to the schedule.
    Same call as `JaxPolicy.set_lr`; it is saved with the checkpoint, as on the JAX side."""
    if lr is not None and not (lr >= 0 and math.isfinite(lr)):
      raise ValueError(f"learning rate must be a finite number >= 0, got {lr}")
    if lr is not None and self._lr_override is None:
      self._override_start = self._step
    elif lr is None and self._lr_override is not None:
      self._schedule_offset += self._step - self._override_start
    self._lr_override = None if lr is None else float(lr)


  # ---- forward ----------------------------------------------------------------------------------

  def _rank_slice(self, batch: TrainBatch):
    """This rank's rows of the (padded) global batch, and the micro-batch count."""
    check_batch(batch, self.model_config.vocab_size, self._max_seq_len)
    rows, n_micro = dist.rows_per_rank(batch.batch_size, self._micro, dist.world_size())
    total = rows * dist.world_size()
    lo = dist.rank() * rows
    # Padding rows: one real (pad-id) token so attention has a key, no loss tokens.
    am = dist.pad_rows(np.asarray(batch.attention_mask), total, 0)
    real = am.copy()   # the router statistics count real tokens only: not the padding rows' one
    am[batch.batch_size:, 0] = 1
    out = dict(
        input_ids=dist.pad_rows(np.asarray(batch.input_ids), total, 0)[lo:lo + rows],
        attention_mask=am[lo:lo + rows],
        token_mask=real[lo:lo + rows],
        loss_mask=dist.pad_rows(np.asarray(batch.loss_mask), total, 0)[lo:lo + rows],
        extras={k: (dist.pad_rows(np.asarray(v), total, 0)[lo:lo + rows] if np.ndim(v) >= 1 else v)
                for k, v in batch.extras.items()})
    return out, n_micro

  def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
               position_ids: np.ndarray | None = None, temperature: float = 1.0, topk_ids=None):
    """(token logprobs [B, T], router logits): the latter, one [B*T, E] tensor per sparse layer,
    only when training a Mixture-of-Experts model (else None). With `topk_ids` [B, T, K] the
    first is (token logprobs, logprobs of those ids [B, T, K])."""
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
    kw = {}
    if attention_mask is not None:
      kw["attention_mask"] = torch.as_tensor(attention_mask, dtype=torch.long, device=self.device)
    if position_ids is not None:   # packed rows: no mask, the segments come from the positions
      kw["position_ids"] = torch.as_tensor(position_ids, dtype=torch.long, device=self.device)
    routed = self.router_loss is not None and self.model.training
    if routed:
      kw["output_router_logits"] = True
    out = self.model(input_ids=ids, use_cache=False, **kw)
    logits = out.logits
    if temperature != 1.0:   # in fp32 (token_logprobs casts anyway); T=1 skips the extra [B,T,V] copy
      logits = logits.to(torch.float32) / float(temperature)
    router = out.router_logits if routed else None
    if topk_ids is not None:
      topk = gathered_logprobs(logits, torch.as_tensor(topk_ids, device=self.device))
      return (token_logprobs(logits, ids), topk), router
    return token_logprobs(logits, ids), router

  def _logprobs(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                temperature: float = 1.0) -> torch.Tensor:
    return self._forward(input_ids, attention_mask, temperature=temperature)[0]

  def _micro_loss(self, lp: torch.Tensor, loss_mask, extras, loss_fn: LossFn, router,
                  token_mask: np.ndarray, num_micro: int, sums: dict):
    """One micro-batch's loss (plus, for a MoE model, its router losses / num_micro, as the JAX
    trainer's step), its backward, and its metrics added to `sums` (`moe_load` [L, E] too)."""
    loss, metrics = loss_fn(lp, loss_mask, extras)
    metrics = dict(metrics)
    if router is not None:
      terms = self.router_loss.terms(router, token_mask)
      loss = loss + self.router_loss.loss(terms) / num_micro
      metrics.update(moe_aux_loss=terms.aux / num_micro, moe_z_loss=terms.z / num_micro)
      sums["moe_load"] = sums.get("moe_load", 0.0) + terms.load
    loss.backward()  # FSDP reduce-scatters (sums) into the sharded .grad, accumulating
    for k, v in {**metrics, "loss": loss}.items():
      sums[k] = sums.get(k, 0.0) + torch.as_tensor(v).detach().to(torch.float64)

  # ---- packed / token-budget micro-batches (dockyard.packing) -------------------------------------

  @property
  def _planned(self) -> bool:
    return bool(self._packing_row_tokens or self._micro_tokens)

  def _plan(self, batch: TrainBatch) -> tuple[list, int]:
    """This rank's micro-batches of the global plan: `packing.PackedMicro`s, or arrays of sequence
    indices (token budget); None is an empty one, so that every rank runs the same number of
    forward/backward rounds (each is a round of FSDP collectives). And the plan's count of real
    micro-batches (over all ranks)."""
    check_batch(batch, self.model_config.vocab_size, self._max_seq_len)
    if self._packing_row_tokens:
      micros = packing.pack_micro_batches(batch, self._packing_row_tokens, self._micro, trim=True)
    else:
      groups = packing.token_budget_groups(packing.seq_lengths(batch), self._micro_tokens)
      micros = [np.asarray(g, np.int64) for g in groups]
    world = dist.world_size()
    real = len(micros)
    micros += [None] * (-len(micros) % world)
    return micros[dist.rank()::world], real

  def _micro_logprobs(self, batch: TrainBatch, micro):
    """(sequence indices, their logprobs [S, T], router logits or None, the real-token mask of the
    rows the model ran) of one planned micro-batch; an empty one runs a two-token dummy row (no
    sequences, no real tokens) so the collectives still happen."""
    t = batch.input_ids.shape[1]
    if micro is None:
      lp, router = self._forward(np.zeros((1, 2), np.int64), np.ones((1, 2), np.int64),
                                 temperature=batch.temperature)
      lp = F.pad(lp, (0, t - 2)) if t >= 2 else lp[:, :t]
      return np.zeros((0,), np.int64), lp, router, np.zeros((1, 2), np.float32)
    if isinstance(micro, packing.PackedMicro):
      # No attention mask: transformers derives the segments from the restarting position_ids.
      rows, router = self._forward(micro.input_ids, position_ids=micro.positions,
                                   temperature=batch.temperature)
      gather = torch.as_tensor(micro.gather, dtype=torch.long, device=self.device)
      valid = torch.as_tensor(micro.valid, device=self.device)
      return micro.seqs, rows.reshape(-1)[gather] * valid, router, micro.segment_ids > 0
    n = int(packing.seq_lengths(batch)[micro].max())
    am = np.asarray(batch.attention_mask)[micro, :n]
    lp, router = self._forward(np.asarray(batch.input_ids)[micro, :n], am, temperature=batch.temperature)
    return micro, F.pad(lp, (0, t - n)), router, am

  def _planned_logprobs(self, batch: TrainBatch) -> np.ndarray:
    full = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=self.device)
    self.model.eval()
    with torch.no_grad():
      for micro in self._plan(batch)[0]:
        seqs, lp, _, _ = self._micro_logprobs(batch, micro)
        full[torch.as_tensor(seqs, device=self.device)] = lp.to(torch.float32)
    # Every sequence was scored on exactly one rank: a sum over ranks assembles the batch.
    full = dist.all_reduce_tensor(full).cpu().numpy()
    return full * np.asarray(batch.attention_mask, full.dtype)

  def _planned_losses(self, batch: TrainBatch, loss_fn: LossFn, totals) -> dict[str, torch.Tensor]:
    sums: dict[str, torch.Tensor] = {}
    loss_mask = np.asarray(batch.loss_mask, np.float32)
    micros, num_micro = self._plan(batch)
    for micro in micros:
      seqs, lp, router, token_mask = self._micro_logprobs(batch, micro)
      if micro is None:   # the dummy row: no loss tokens, zero extras of the right shapes
        rows = lambda v: np.zeros((1,) + np.shape(v)[1:], np.asarray(v).dtype)
      else:
        rows = lambda v: np.asarray(v)[seqs]
      extras = {k: torch.as_tensor(rows(v)) if np.ndim(v) >= 1 else torch.as_tensor(v)
                for k, v in batch.extras.items()}
      # Gradients accumulate over micro-batches (FSDP sums them over ranks).
      self._micro_loss(lp, torch.as_tensor(rows(loss_mask)), {**extras, **totals}, loss_fn, router,
                       token_mask, num_micro, sums)
    return sums

  def logprobs(self, batch: TrainBatch) -> np.ndarray:
    if self._planned:
      return self._planned_logprobs(batch)
    part, n_micro = self._rank_slice(batch)
    rows = n_micro * self._micro
    # This rank's real rows: padding rows past them are not scored (a micro-batch keeps at least
    # one row, so every rank joins every forward's collectives) and report 0. The refit canary's
    # 2-row probe ran on a whole micro-batch of rows before.
    real = min(max(batch.batch_size - dist.rank() * rows, 0), rows)
    outs = []
    self.model.eval()  # the same function train_step differentiates, minus any dropout
    with torch.no_grad():
      for i in range(n_micro):
        lo = i * self._micro
        s = slice(lo, max(min(lo + self._micro, real), lo + 1))
        outs.append(self._logprobs(part["input_ids"][s], part["attention_mask"][s], batch.temperature))
    mine = torch.cat(outs, 0)
    if mine.shape[0] < rows:   # equal shapes on every rank for the gather
      mine = torch.cat([mine, mine.new_zeros((rows - mine.shape[0],) + tuple(mine.shape[1:]))], 0)
    full = dist.all_gather_rows(mine)[:batch.batch_size].cpu().numpy()
    return full * np.asarray(batch.attention_mask, full.dtype)  # padding reports 0, as in JAX

  # ---- training ---------------------------------------------------------------------------------

  def _fixed_losses(self, batch: TrainBatch, loss_fn: LossFn, totals) -> dict[str, torch.Tensor]:
    """Forward/backward of this rank's rows, `micro_batch_size` rows at a time; summed metrics."""
    part, n_micro = self._rank_slice(batch)
    # The global plan's micro-batches that hold any batch row (the router losses' 1/num_micro):
    # rank r's i-th starts at global row r * rows + i * micro_batch_size.
    rows = n_micro * self._micro
    num_micro = sum(r * rows + i * self._micro < batch.batch_size
                    for r in range(dist.world_size()) for i in range(n_micro))
    sums: dict[str, torch.Tensor] = {}
    for i in range(n_micro):
      s = slice(i * self._micro, (i + 1) * self._micro)
      topk_ids = part["extras"]["topk_ids"][s] if "topk_ids" in part["extras"] else None
      lp, router = self._forward(part["input_ids"][s], part["attention_mask"][s],
                                 temperature=batch.temperature, topk_ids=topk_ids)
      extras = {k: (torch.as_tensor(v[s]) if np.ndim(v) >= 1 else torch.as_tensor(v))
                for k, v in part["extras"].items()}
      if topk_ids is not None:   # the top-k contract of dockyard.policy
        lp, extras["topk_logprobs"] = lp
      self._micro_loss(lp, torch.as_tensor(part["loss_mask"][s]), {**extras, **totals}, loss_fn, router,
                       part["token_mask"][s], num_micro, sums)
    return sums

  def topk_logprobs(self, batch: TrainBatch, k: int) -> tuple[np.ndarray, np.ndarray]:
    part, n_micro = self._rank_slice(batch)
    ids, lps = [], []
    self.model.eval()
    with torch.no_grad():
      for i in range(n_micro):
        s = slice(i * self._micro, (i + 1) * self._micro)
        tokens = torch.as_tensor(part["input_ids"][s], dtype=torch.long, device=self.device)
        mask = torch.as_tensor(part["attention_mask"][s], dtype=torch.long, device=self.device)
        logits = self.model(input_ids=tokens, attention_mask=mask, use_cache=False).logits
        logp = F.log_softmax(logits[:, :-1].to(torch.float32) / float(batch.temperature), dim=-1)
        values, top = logp.topk(int(k), dim=-1)
        ids.append(F.pad(top, (0, 0, 1, 0)).to(torch.int32))
        lps.append(F.pad(values, (0, 0, 1, 0)))
    mask = np.asarray(batch.attention_mask)[:, :, None]
    ids = dist.all_gather_rows(torch.cat(ids, 0))[:batch.batch_size].cpu().numpy() * mask
    lps = dist.all_gather_rows(torch.cat(lps, 0))[:batch.batch_size].cpu().numpy() * mask
    return ids.astype(np.int32), lps.astype(np.float32)

  def train_step(self, batch: TrainBatch, loss_fn: LossFn) -> dict[str, float]:
    if self._planned and "topk_ids" in batch.extras:
      raise ValueError("extras['topk_ids'] (top-k distillation) needs fixed micro-batches of unpacked "
                       "rows: set config.policy.packing_row_tokens=0 and config.optim.micro_batch_tokens=0")
    lm = np.asarray(batch.loss_mask, np.float32)
    totals = dict(total_tokens=torch.tensor(float(lm.sum())),
                  total_sequences=torch.tensor(float((lm.sum(-1) > 0).sum())))
    self.model.train()
    sums = (self._planned_losses if self._planned else self._fixed_losses)(batch, loss_fn, totals)
    load = sums.pop("moe_load", None)   # [L, E] expert assignments of this rank's micro-batches
    out = dist.all_reduce_sum(sums)
    if self.router_loss is not None:
      out.update(moe.load_metrics(dist.all_reduce_tensor(load).cpu()))

    params = [p for p in self.model.parameters() if p.grad is not None]
    grads = [p.grad for p in params]
    norm = optim.global_norm(grads)
    optim.clip_(grads, norm, float(self._optim["max_grad_norm"]))
    lr = self._lr_override if self._lr_override is not None else optim.lr_at(
        self._step - self._schedule_offset, self._optim, self._total_steps)
    for group in self.optimizer.param_groups:
      group["lr"] = lr
    self.optimizer.step()
    self.optimizer.zero_grad(set_to_none=True)
    self._step += 1
    out.update(grad_norm=float(norm), lr=lr, total_tokens=float(totals["total_tokens"]))
    return out

  # ---- refit ------------------------------------------------------------------------------------

  def _check_names(self) -> None:
    """HF module names are the name-map's HF names (peft's `base_layer` aside, and a sparse layer's
    experts, which transformers fuses: `name_map.module_param`); the two must agree on the set."""
    expected = {name_map.module_param(e, self.model_config).name for e in name_map.table(self.model_config)}
    have = {lora.base_name(n) for n, _ in self.model.named_parameters() if not lora.is_adapter(n)}
    if have != expected:
      raise KeyError(f"HF parameters and the {self.model_config.family} name-map disagree: "
                     f"missing from model {sorted(expected - have)[:5]}, "
                     f"unknown to name-map {sorted(have - expected)[:5]}")

  def named_weights(self, touched_only: bool = False) -> Iterator[tuple[str, np.ndarray]]:
    """Streams (hf_name, array) in the name-map's order, one parameter gathered at a time; LoRA
    adapters merged (`W + scale * B A`). `touched_only`: under LoRA, only the adapted
    projections (what a step can change); without LoRA, everything. A sparse layer's fused expert
    tensors are gathered once for the layer and sent one expert slice at a time, under the
    checkpoint's per-expert names.

    A gather (`full_tensor`) is a collective: under torchrun every rank must iterate this."""
    params = {lora.base_name(n): p for n, p in self.model.named_parameters() if not lora.is_adapter(n)}
    adapted = lora.lora_modules(self.model)
    fused: dict[str, torch.Tensor] = {}   # the current sparse layer's gathered expert tensors
    for entry in name_map.table(self.model_config):
      if entry.hf in adapted:
        yield entry.hf, _to_numpy(lora.merged(adapted[entry.hf]))
        continue
      if touched_only and self.lora_config is not None:
        continue
      where = name_map.module_param(entry, self.model_config)
      if where.expert >= 0:
        if where.name not in fused:   # a layer's expert entries are contiguous in the table
          fused[where.name] = _gather(params[where.name])
        x = fused[where.name][where.expert]
        if where.rows is not None:
          x = x[where.rows[0]:where.rows[1]]
        yield entry.hf, _to_numpy(x.clone())   # its own copy, not a view into the layer's tensor
        continue
      fused.clear()   # past that layer's experts
      full = _gather(params[where.name])
      yield entry.hf, _to_numpy(full)

  def save_hf(self, path: str) -> None:
    """An HF directory (safetensors + the source's config and tokenizer files) of the policy's
    weights, LoRA adapters merged. Every rank must call it (gathers); rank 0 writes."""
    from safetensors.numpy import save_file
    tensors = dict(self.named_weights())
    if dist.rank() == 0:
      os.makedirs(path, exist_ok=True)
      save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
      for name in os.listdir(self.model_path):
        src = os.path.join(self.model_path, name)
        if os.path.isfile(src) and not name.endswith((".safetensors", ".safetensors.index.json", ".bin")):
          shutil.copy(src, os.path.join(path, name))

  def save_adapter(self, path: str) -> int:
    """The LoRA adapters as a PEFT adapter directory (what vLLM's LoRARequest loads); returns
    the bytes of its tensors. Every rank must call it (gathers); rank 0 writes."""
    if self.lora_config is None:
      raise ValueError("save_adapter needs LoRA (config.policy.lora.enabled=True)")
    entries = {e.hf: e for e in name_map.table(self.model_config)}
    tensors = {}
    for hf, module in lora.lora_modules(self.model).items():
      a_name, b_name = name_map.peft_names(entries[hf])
      a, b = lora.factors(module)
      tensors[a_name], tensors[b_name] = _to_numpy(a), _to_numpy(b)
    return write_peft_adapter(path, tensors, self.lora_config) if dist.rank() == 0 else 0

  # ---- checkpoints (the same calls as JaxPolicy's, so the loop needs no backend branch) ----------

  def checkpointer(self, directory: str) -> checkpoint.Checkpointer:
    """The (cached) manager of `directory`: it keeps the newest checkpoint (under LoRA: of the
    adapters alone, the frozen base is not written)."""
    key = os.path.abspath(directory)
    if key not in self._checkpointers:
      self._checkpointers[key] = checkpoint.Checkpointer(directory,
                                                         trainable_only=self.lora_config is not None)
    return self._checkpointers[key]

  def save(self, directory: str, *, data_iter=None) -> None:
    """Saves model (under LoRA: the adapters), AdamW state and step as `directory/<step>/` (DCP)."""
    self.checkpointer(directory).save(self._step, self.model, self.optimizer, data_iter=data_iter,
                                      extra={"lr_override": self._lr_override,
                                             "schedule_offset": self._schedule_offset,
                                             "override_start": self._override_start,
                                             "lora": None if self.lora_config is None
                                             else self.lora_config.to_json()})

  def restore(self, directory: str, *, data_iter=None, step: int | None = None) -> dict:
    """Restores the latest (or `step`) checkpoint under `directory`; returns its bookkeeping. An
    adapter checkpoint loads onto a policy built from the same base with the same LoRA shapes."""
    ckpt = self.checkpointer(directory)
    check_lora_matches(ckpt.meta(step).get("lora"), self.lora_config, directory)
    meta = ckpt.restore(self.model, self.optimizer, step=step, data_iter=data_iter)
    self._step = int(meta["step"])
    self._lr_override = meta.get("lr_override")
    self._schedule_offset = int(meta.get("schedule_offset", 0))
    self._override_start = int(meta.get("override_start", 0))
    return meta


def _broadcast_from_rank0(model: torch.nn.Module, full_state: dict, device: torch.device) -> None:
  """Fills every rank's shards (and buffers such as RoPE's inv_freq, which the meta-device
  ranks lack) from rank 0's full state dict."""
  import torch.distributed as tdist
  from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
  if dist.rank() != 0:
    model.to_empty(device=device)
  set_model_state_dict(model, full_state, options=StateDictOptions(
      full_state_dict=True, broadcast_from_rank0=True))
  for _, buf in model.named_buffers():  # non-persistent buffers are not in any state dict
    tdist.broadcast(buf, src=0)


def _gather(p: torch.Tensor) -> torch.Tensor:
  """The full value of a (possibly sharded) parameter, never aliasing the live weight."""
  p = p.detach()
  local = p.to_local() if hasattr(p, "to_local") else p
  full = p.full_tensor() if hasattr(p, "full_tensor") else p
  if full.data_ptr() == local.data_ptr():  # one rank: the "gather" aliases the live weight
    full = full.clone()
  return full


def _to_numpy(t: torch.Tensor) -> np.ndarray:
  t = t.cpu().contiguous()
  if t.dtype == torch.bfloat16:  # NumPy has no bfloat16; ml_dtypes' is what safetensors/JAX use
    import ml_dtypes
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return t.numpy()

"""The `Generator` seam: everything the GRPO loops, the evaluator and refit ask of an inference
engine, so nothing above it probes for methods.

Implemented by the vLLM engine (`dockyard.rollout.vllm_engine`) and the Ray fleet that spreads
requests over several engines. Weights arrive through `update_weights` ((name, array) pairs: in
process, or through Ray's object store to a fleet) or `load_shared_memory`; the fleet adds the
broadcast group's receive methods (`dockyard.refit.nccl`).
"""
from __future__ import annotations

import abc
import asyncio
import dataclasses
import time
from typing import Iterable, Sequence

import numpy as np


@dataclasses.dataclass
class SamplingParams:
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = -1
  max_tokens: int = 256
  seed: int | None = None
  stop: tuple[str, ...] = ()


@dataclasses.dataclass
class Completion:
  """One sampled completion of one prompt."""
  prompt_ids: list[int]
  token_ids: list[int]
  logprobs: list[float]          # log p(token_ids[i]) under the sampled distribution (after temperature)
  finish_reason: str             # 'stop' | 'length' | 'abort'
  weight_version: int            # the weight version that produced it (first token)
  text: str = ""
  token_weight_versions: list[int] | None = None  # per token, when weights changed mid-request
  # Per token: 1 where the model generated it and it is trained on, 0 where not (a multi-turn
  # episode's tool results and template tokens, `dockyard.grpo.episodes`). None: every token.
  loss_mask: list[int] | None = None


class Generator(abc.ABC):
  """Samples completions and accepts new weights."""

  # Where the engines run: True when they are in this process (arrays can be handed over as they
  # are); a fleet of engines in other processes says False. refit's 'auto' transport reads it.
  in_process: bool = True
  # The engine's vocabulary size (the refit canary draws its probe ids below it).
  vocab_size: int
  # Seconds this process has spent inside the engine's batches (engine utilization; the async
  # loop reports it). 0 where the engine runs elsewhere and nothing here measures it.
  busy_s: float = 0.0
  # Whether the engines serve LoRA adapters (`load_lora_adapter`; refit lora_mode='adapter').
  lora_enabled: bool = False

  @abc.abstractmethod
  def generate(self, prompt_ids: Sequence[Sequence[int]], n: int,
               sampling: SamplingParams) -> list[list[Completion]]:
    """For each prompt, `n` completions."""

  async def agenerate(self, prompt_ids: Sequence[int], n: int, sampling: SamplingParams) -> list[Completion]:
    """One prompt's n completions, awaitable, so that many requests can be in flight. Default: a
    worker thread over `generate`; an in-process engine batches (`BatchedAgenerate`), the Ray
    fleet sends each request to its least-loaded engine."""
    return (await asyncio.to_thread(self.generate, [list(prompt_ids)], n, sampling))[0]

  def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Per sequence, [T] raw (T=1) logprobs of each token given the ones before it (entry 0 is
    0): what the refit canary compares with the trainer's."""
    raise NotImplementedError(f"{type(self).__name__} does not score prompts (the refit canary needs "
                              f"prompt_logprobs; set config.refit.canary.enabled=False)")

  @abc.abstractmethod
  def update_weights(self, named_tensors: Iterable[tuple[str, np.ndarray]], version: int) -> None:
    """Loads HF-named weights into the engine; `version` becomes the current weight version."""

  @abc.abstractmethod
  def prepare_for_generation(self) -> None:
    """Makes the engine ready to sample after a weight update (re-packing, cache reset)."""

  def load_shared_memory(self, block_name: str, index, version: int) -> None:
    """Loads weights from a `wire.write_shared_memory` block (config.refit.transport='shared_memory')."""
    raise NotImplementedError(f"{type(self).__name__} cannot load weights from shared memory "
                              f"(config.refit.transport='shared_memory')")

  def load_lora_adapter(self, path: str, version: int) -> None:
    """Serves the PEFT adapter directory `path` on top of the base weights as `version`
    (config.refit.lora_mode='adapter')."""
    raise NotImplementedError(f"{type(self).__name__} cannot serve LoRA adapters "
                              f"(config.refit.lora_mode='adapter')")

  @property
  @abc.abstractmethod
  def weight_version(self) -> int:
    """The version of the weights currently loaded."""


class BatchedAgenerate:
  """`agenerate` for an engine in this process with a `generate_many` that runs several requests
  as one batch: requests that arrive while a batch runs go to it together, on a worker thread, so
  many groups in flight share the engine's continuous batching (as they do on the fleet's actors).
  Mixed in before `Generator`."""

  @abc.abstractmethod
  def generate_many(self, requests: Sequence[tuple]) -> list[list[list[Completion]]]:
    """Several (prompt_ids, n, sampling) requests as one batch; per request, per prompt, its n
    completions."""

  async def agenerate(self, prompt_ids: Sequence[int], n: int, sampling: SamplingParams) -> list[Completion]:
    """Queued for the next `generate_many` batch (or starts one)."""
    fut = asyncio.get_running_loop().create_future()
    queue = self.__dict__.setdefault("_agenerate_queue", [])
    queue.append((([list(prompt_ids)], n, sampling), fut))
    if not self.__dict__.get("_agenerate_draining"):
      self._agenerate_draining = True
      asyncio.get_running_loop().create_task(self._drain_agenerate())
    return await fut

  async def _drain_agenerate(self) -> None:
    try:
      while self._agenerate_queue:
        items, self._agenerate_queue = self._agenerate_queue, []
        items = [(r, f) for r, f in items if not f.done()]   # cancelled (timed out) while queued
        if not items:
          continue
        t0 = time.perf_counter()
        try:
          outs = await asyncio.to_thread(self.generate_many, [r for r, _ in items])
        except Exception as e:  # noqa: BLE001 — every caller of the batch hears of it
          for _, f in items:
            if not f.done():
              f.set_exception(e)
          continue
        finally:
          self.busy_s += time.perf_counter() - t0
        for (_, f), out in zip(items, outs):
          if not f.done():
            f.set_result(out[0])
    finally:
      self._agenerate_draining = False

"""The `Generator` seam: what the GRPO loops need from an inference engine.

Implemented by the vLLM engine (`dockyard.rollout.vllm_engine`) and the Ray fleet that spreads
requests over several engines.
"""
from __future__ import annotations

import abc
import dataclasses
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


class Generator(abc.ABC):
  """Samples completions and accepts new weights."""

  @abc.abstractmethod
  def generate(self, prompt_ids: Sequence[Sequence[int]], n: int,
               sampling: SamplingParams) -> list[list[Completion]]:
    """For each prompt, `n` completions."""

  @abc.abstractmethod
  def update_weights(self, named_tensors: Iterable[tuple[str, np.ndarray]], version: int) -> None:
    """Loads HF-named weights into the engine; `version` becomes the current weight version."""

  @abc.abstractmethod
  def prepare_for_generation(self) -> None:
    """Makes the engine ready to sample after a weight update (re-packing, cache reset)."""

  @property
  @abc.abstractmethod
  def weight_version(self) -> int:
    """The version of the weights currently loaded."""

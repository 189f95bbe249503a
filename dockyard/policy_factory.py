"""Builds the configured `Policy`: the one place that chooses a trainer backend.

`config.policy.backend` is 'jax' (`dockyard.trainer_jax.policy.JaxPolicy`) or 'torch'
(`dockyard.trainer_torch.policy.TorchPolicy`). Each is imported only when chosen, so a JAX run
never imports torch's distributed stack and a torch run never imports JAX.
"""
from __future__ import annotations

from typing import Any

from dockyard.policy import Policy


def make_policy(config: Any, model_path: str) -> Policy:
  backend = config.policy.backend
  if backend == "jax":
    from dockyard.trainer_jax.policy import JaxPolicy
    return JaxPolicy.from_hf(model_path, config)
  if backend == "torch":
    from dockyard.trainer_torch.policy import TorchPolicy
    return TorchPolicy.from_hf(model_path, config)
  raise ValueError(f"config.policy.backend: must be 'jax' or 'torch', got {backend!r}")

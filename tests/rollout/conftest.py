"""Session fixtures for the rollout + refit tests: one tiny model, one in-process vLLM engine,
one local Ray (2 CPUs) with a 2-engine fleet. Heavy parts are built once and shared."""
from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest

from configs import swe
from dockyard.models.tiny import make_tiny_model


@pytest.fixture(scope="session")
def config():
  config = swe.get_config("tiny")
  config.rollout.max_model_len = 512
  return config


@pytest.fixture(scope="session")
def tiny_path():
  return make_tiny_model()


@pytest.fixture(scope="session")
def engine(config, tiny_path):
  from dockyard.rollout.vllm_engine import VLLMEngine
  return VLLMEngine(tiny_path, config.rollout, seed=0)


@pytest.fixture(scope="session")
def keep_engine():
  """Keeps an engine that a test builds for itself (another model, LoRA on) alive to the end of
  the session. In-process vLLM engines share process-global model-parallel state, and tearing one
  down (when it is garbage-collected) destroys that state under the session `engine` that later
  tests use ("pipeline model parallel group is not initialized")."""
  kept = []
  yield kept.append


@pytest.fixture()
def policy(tiny_path):
  from tests.rollout.hf_policy import HFTorchPolicy
  return HFTorchPolicy.from_hf(tiny_path)



@pytest.fixture(scope="session")
def fleet(config, tiny_path):
  """Two engines as Ray actors on a local Ray with 2 CPUs (0.5 CPU per engine bundle)."""
  from dockyard.rollout.fleet import RolloutFleet
  run_config = config.copy_and_resolve_references()
  run_config.rollout.num_engines = 2
  f = RolloutFleet(run_config, tiny_path, num_cpus=2)
  yield f
  f.shutdown()


@pytest.fixture()
def synced_policy(engine, policy):
  """A fresh policy whose weights the shared engine has loaded (other tests leave theirs behind)."""
  engine.update_weights(policy.named_weights(), engine.weight_version + 1)
  return policy

"""Fixtures for the JAX trainer's tests: 8 fake CPU devices, tiny HF models per family, a config.

XLA_FLAGS must be set before JAX initialises its backend; `setdefault` keeps a value that an
outer conftest already chose. Tests that need 8 devices skip (with the reason) when JAX was
initialised earlier in the process with fewer.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import json  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models():
  """family -> HF directory: qwen2 and qwen3 with tied embeddings, llama untied."""
  from dockyard.models.tiny import make_tiny_model
  return {
      "qwen2": make_tiny_model({"family": "qwen2"}),
      "qwen3": make_tiny_model({"family": "qwen3"}),
      "llama": make_tiny_model({"family": "llama", "tie_word_embeddings": False}),
  }


@pytest.fixture(scope="session")
def llama_variant(tmp_path_factory):
  """A Llama with every optional piece on: q/k/v/o bias, MLP bias, llama3 RoPE scaling."""
  import torch
  import transformers
  from dockyard.models.tiny import make_hf_config
  cfg = make_hf_config({"family": "llama", "tie_word_embeddings": False})
  cfg.attention_bias = True
  cfg.mlp_bias = True
  cfg.rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}
  torch.manual_seed(1)
  model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
  with torch.no_grad():  # biases init to zero; make them matter
    for name, p in model.named_parameters():
      if name.endswith("bias"):
        p.normal_(0, 0.1)
  out = str(tmp_path_factory.mktemp("llama_variant"))
  model.save_pretrained(out)
  return out


@pytest.fixture(scope="session")
def qwen2_linear_rope(tiny_models, tmp_path_factory):
  """The tiny Qwen2 with 'linear' RoPE scaling (factor 4) written into its config.json."""
  import shutil
  out = str(tmp_path_factory.mktemp("qwen2_linear"))
  for name in ("config.json", "model.safetensors"):
    shutil.copy(os.path.join(tiny_models["qwen2"], name), out)
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  cfg["rope_parameters"] = {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}
  with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(cfg, f)
  return out


@pytest.fixture()
def config():
  """The tiny experiment config (fresh per test: tests edit it)."""
  from dockyard.validate import load_config_file
  here = os.path.dirname(os.path.abspath(__file__))
  config = load_config_file(os.path.join(here, "..", "..", "configs", "swe.py"))
  config.mesh.shape = (1, 1, 1)
  return config

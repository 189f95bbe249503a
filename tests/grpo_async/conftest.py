"""Fixtures for the async GRPO tests: JAX on CPU, a locally trained tokenizer, and the GRPO
room's small fakes (`tests/grpo/grpo_fakes.py`) on the import path."""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
for path in (HERE, os.path.join(os.path.dirname(HERE), "grpo")):
  if path not in sys.path:
    sys.path.insert(0, path)

import pytest


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
  """A real byte-level BPE tokenizer with the ChatML template, trained here on arithmetic text."""
  from dockyard.models import tiny
  out = str(tmp_path_factory.mktemp("tok"))
  corpus = [" ".join(f"What is {a} + {b}? {a + b}" for b in range(10)) for a in range(10)]
  tiny.train_tokenizer(out, vocab_size=300, corpus=corpus)
  return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def real_parts():
  """The real stack for the end-to-end test: a tiny Qwen2 made locally, its tokenizer, one
  in-process CPU vLLM engine and the math config it runs with (built once)."""
  import run_async_real   # an import error fails the tests that need these parts, never skips them
  config = run_async_real.config_for(3)
  return (config, *run_async_real.build(config))

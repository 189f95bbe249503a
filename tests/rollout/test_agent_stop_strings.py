"""What the agent's turn loop relies on from vLLM (`dockyard.agent.episode`): with a stop string,
the returned token ids are the ones generated up to and including the token that completed the
stop string (nothing after it), so decoding them shows the whole `</tool_call>`, and the
trajectory keeps the engine's exact ids; and prefix caching is on, so turn k+1 (the whole
trajectory again) does not recompute turn k."""
import pytest

from dockyard.rollout.base import SamplingParams


@pytest.mark.slow
def test_a_stop_string_keeps_the_token_that_completes_it(engine, tiny_path):
  import transformers
  tok = transformers.AutoTokenizer.from_pretrained(tiny_path)
  prompt = tok.encode("<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n")
  [[free]] = engine.generate([prompt], 1, SamplingParams(temperature=0.0, max_tokens=24))
  ids = free.token_ids
  text = tok.decode(ids)
  assert len(ids) >= 8, free
  # a stop string that ends inside token 6's text, whichever tokens the random model emits
  stop = tok.decode(ids[:7])[-2:]
  first = text.find(stop)
  k = next(k for k in range(1, len(ids) + 1) if len(tok.decode(ids[:k])) >= first + len(stop))
  assert k < len(ids)   # the stop cuts the free run short
  [[cut]] = engine.generate([prompt], 1, SamplingParams(temperature=0.0, max_tokens=24, stop=(stop,)))
  assert cut.finish_reason == "stop"
  assert cut.token_ids == ids[:k] and len(cut.logprobs) == k
  assert stop in tok.decode(cut.token_ids)


@pytest.mark.slow
def test_prefix_caching_is_on(engine):
  assert engine.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching

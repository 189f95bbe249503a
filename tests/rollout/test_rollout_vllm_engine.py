"""The in-process vLLM engine against the HF forward of the same tiny checkpoint."""
import numpy as np
import pytest
import transformers

from dockyard.rollout.base import SamplingParams
from dockyard.rollout.chat import encode_prompt
from tests.rollout.hf_policy import LOGPROB_TOL, batch_of, hf_greedy

PROMPTS = [[5, 6, 7, 8, 9], [100, 200, 300]]


@pytest.mark.slow
def test_sampled_completions_have_ids_logprobs_reason_version(engine):
  out = engine.generate(PROMPTS, n=3, sampling=SamplingParams(temperature=1.0, max_tokens=6, seed=1))
  assert len(out) == 2 and all(len(group) == 3 for group in out)
  for prompt, group in zip(PROMPTS, out):
    for c in group:
      assert c.prompt_ids == prompt
      assert 1 <= len(c.token_ids) <= 6 and len(c.logprobs) == len(c.token_ids)
      assert all(lp <= 0.0 and np.isfinite(lp) for lp in c.logprobs)
      assert c.finish_reason in ("stop", "length")
      assert c.weight_version == engine.weight_version


@pytest.mark.slow
def test_greedy_and_logprobs_match_hf_forward(engine, synced_policy):
  policy = synced_policy
  out = engine.generate(PROMPTS, n=1, sampling=SamplingParams(temperature=0.0, max_tokens=8))
  for prompt, (c,) in zip(PROMPTS, out):
    assert c.token_ids == hf_greedy(policy, prompt, len(c.token_ids))
    seq = prompt + c.token_ids
    hf = policy.logprobs(batch_of([seq]))[0, len(prompt):]
    np.testing.assert_allclose(c.logprobs, hf, atol=LOGPROB_TOL)


@pytest.mark.slow
def test_prompt_logprobs_match_hf(engine, synced_policy):
  policy = synced_policy
  seqs = [[3, 40, 41, 500, 7, 9, 11], [12, 13]]
  got = engine.prompt_logprobs(seqs)
  want = policy.logprobs(batch_of(seqs))
  for i, s in enumerate(seqs):
    assert got[i][0] == 0.0
    np.testing.assert_allclose(got[i], want[i, :len(s)], atol=LOGPROB_TOL)


@pytest.mark.slow
def test_bad_prompts_are_named(engine):
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    engine.generate([[1, 2], []], n=1, sampling=SamplingParams(max_tokens=2))
  with pytest.raises(ValueError, match=r"outside \[0, 1024\)"):
    engine.generate([[1, 5000]], n=1, sampling=SamplingParams(max_tokens=2))
  with pytest.raises(ValueError, match="n must be >= 1"):
    engine.generate([[1, 2]], n=0, sampling=SamplingParams(max_tokens=2))
  with pytest.raises(ValueError, match="list of token ids"):
    engine.generate(["hello"], n=1, sampling=SamplingParams(max_tokens=2))


def test_encode_prompt_uses_the_template(tiny_path):
  tok = transformers.AutoTokenizer.from_pretrained(tiny_path)
  msgs = [{"role": "system", "content": "Fix the bug."}, {"role": "user", "content": "x = 1 + 1"}]
  ids = encode_prompt(tok, msgs)
  assert tok.decode(ids) == ("<|im_start|>system\nFix the bug.<|im_end|>\n<|im_start|>user\n"
                             "x = 1 + 1<|im_end|>\n<|im_start|>assistant\n")
  with pytest.raises(ValueError, match="message 0 needs 'role' and 'content'"):
    encode_prompt(tok, [{"content": "no role"}])
  with pytest.raises(ValueError, match="empty"):
    encode_prompt(tok, [])


@pytest.mark.slow
def test_seeded_sampling_of_many_long_prompts(engine):
  """Regression: seeded requests whose prefills exceed one step's token budget crashed CPU vLLM
  ('CPU Generator does not use offset') when prefills were chunked; engine_kwargs disables that."""
  prompts = [[5 + (i * 7 + j) % 400 for j in range(400)] for i in range(8)]
  out = engine.generate(prompts, n=2, sampling=SamplingParams(temperature=1.0, max_tokens=16, seed=7))
  assert len(out) == 8 and all(len(group) == 2 for group in out)
  assert all(len(c.token_ids) == len(c.logprobs) > 0 for group in out for c in group)
  again = engine.generate(prompts[:1], n=2, sampling=SamplingParams(temperature=1.0, max_tokens=16, seed=7))
  assert again[0][0].token_ids == out[0][0].token_ids   # the seed makes the samples reproducible


@pytest.mark.slow
def test_a_seeded_request_gives_each_prompt_its_own_stream(engine):
  """Regression: one request seed was applied to every prompt, so equal prompts got equal samples
  (and sample i of every prompt shared a random stream)."""
  prompt = [5 + j % 50 for j in range(20)]
  sampling = SamplingParams(temperature=1.0, max_tokens=16, seed=11)
  out = engine.generate([prompt] * 4, n=2, sampling=sampling)
  firsts = {tuple(group[0].token_ids) for group in out}
  assert len(firsts) > 1, "every copy of the prompt drew the same sample"
  again = engine.generate([prompt] * 4, n=2, sampling=sampling)
  assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in out]

"""A scripted stand-in for the model: a `Generator` whose next turn is a function of the
conversation so far, returned as token ids the way vLLM returns them (cut after the first stop
string, `finish_reason` 'length' at `max_tokens`, the end-of-turn token on a final answer)."""
import asyncio

from dockyard.rollout.base import Completion, Generator


class ScriptedGenerator(Generator):

  def __init__(self, tokenizer, respond, delay_s: float = 0.0, logprob: float = -0.25):
    """`respond(prompt_text) -> str`: the assistant's next turn given the decoded trajectory."""
    self.tokenizer, self.respond, self.delay_s, self.logprob = tokenizer, respond, delay_s, logprob
    self.vocab_size = len(tokenizer)
    self.requests = []          # (prompt ids, sampling) of each call
    self.in_flight = self.max_in_flight = 0

  async def agenerate(self, prompt_ids, n, sampling):
    self.requests.append((list(prompt_ids), sampling))
    self.in_flight += 1
    self.max_in_flight = max(self.max_in_flight, self.in_flight)
    try:
      await asyncio.sleep(self.delay_s)
      return self.generate([prompt_ids], n, sampling)[0]
    finally:
      self.in_flight -= 1

  def generate(self, prompt_ids, n, sampling):
    out = []
    for prompt in prompt_ids:
      text = self.respond(self.tokenizer.decode(prompt, skip_special_tokens=False))
      ids = self.tokenizer.encode(text, add_special_tokens=False)
      finish = "stop"
      stops = [text.find(s) + len(s) for s in sampling.stop if s in text]
      if stops:   # vLLM keeps the token that completed the stop string, and nothing after it
        cut = min(stops)
        ids = next(ids[:k] for k in range(1, len(ids) + 1)
                   if len(self.tokenizer.decode(ids[:k], skip_special_tokens=False)) >= cut)
      else:
        ids = ids + [self.tokenizer.eos_token_id]
      if len(ids) > sampling.max_tokens:
        ids, finish = ids[:sampling.max_tokens], "length"
      out.append([Completion(prompt_ids=list(prompt), token_ids=ids, logprobs=[self.logprob] * len(ids),
                             finish_reason=finish, weight_version=3) for _ in range(n)])
    return out

  def update_weights(self, named_tensors, version):
    raise NotImplementedError

  def prepare_for_generation(self):
    pass

  @property
  def weight_version(self):
    return 3

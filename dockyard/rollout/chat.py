"""Chat messages -> prompt token ids through the tokenizer's own chat template (`encode_prompt`);
a completion's ids -> its text (`decode`).

The one prompt encoder: the GRPO trajectory sources and the evaluator build prompts with
`encode_prompt`, so the ids vLLM samples from are exactly the ids the trainer later scores. SFT
(the warm start and configs/sft.py) renders whole conversations through `dockyard.conversation`,
whose ids before an assistant turn are these (tests/supervised/test_conversation_mask.py).
"""
from __future__ import annotations

from typing import Mapping, Sequence


def encode_prompt(tokenizer, messages: Sequence[Mapping[str, str]],
                  add_generation_prompt: bool = True) -> list[int]:
  """Token ids of `messages` rendered by `tokenizer.chat_template`, ready for the assistant turn."""
  if not messages:
    raise ValueError("encode_prompt: `messages` is empty")
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
      raise ValueError(f"encode_prompt: message {i} needs 'role' and 'content' keys, got {m!r}")
  if not tokenizer.chat_template:
    raise ValueError(f"encode_prompt: tokenizer {type(tokenizer).__name__} has no chat_template")
  # transformers 5 returns a BatchEncoding for tokenize=True unless return_dict=False.
  ids = tokenizer.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=add_generation_prompt,
                                      return_dict=False)
  if isinstance(ids, Mapping):   # some tokenizers still return a BatchEncoding
    ids = ids["input_ids"]
  return [int(t) for t in ids]


def decode(tokenizer, completion) -> str:
  """A completion's text: the engine's own detokenization when it sent one, else the tokenizer's
  (special tokens skipped)."""
  return completion.text if completion.text else tokenizer.decode(completion.token_ids, skip_special_tokens=True)

"""A chat conversation -> its token ids and the mask of its assistant turns, from the chat template.

The SFT data (`dockyard.supervised.data`) and the GRPO SFT warm start (`dockyard.grpo.sft`) encode
their targets here, so both train exactly the tokens this module marks. Depends on nothing in
dockyard (a tokenizer in, lists of ints out).

Which tokens are trained (`encode_conversation`): the assistant turns', found from the chat
template's own rendering, never from a hard-coded role marker. Two ways, picked per tokenizer
(`mask_method`):
  generation  the template marks assistant text with `{% generation %}` blocks: transformers'
              `apply_chat_template(..., return_assistant_tokens_mask=True)` gives the mask, and
              what is inside the blocks is the template author's choice.
  prefix      otherwise (ChatML templates such as the tiny model's and SmolLM2's have no such
              blocks): the conversation is rendered once to text, and assistant message i's
              characters are where render(messages[:i], add_generation_prompt=True) ends and
              render(messages[:i + 1]) ends. Both renderings must be prefixes of the whole one (a
              template that rewrites earlier turns, e.g. drops their reasoning, is an error naming
              the message). The text is tokenized once with offsets; a token is trained when its
              characters overlap the span (the rule transformers uses for `{% generation %}`), and
              the span is cut after its last EOS token: the trained tokens are the assistant's
              content and the end-of-turn EOS, not the newline the template writes between turns,
              since sampling stops at EOS (`dockyard.rollout`) and never produces that newline. A
              turn without EOS is an error: the model would not learn to stop.
Character spans on one tokenization, rather than tokenizing each rendering and diffing ids, so a
BPE merge across a turn boundary cannot shift the mask; the ids are those of the whole rendered
text, the ids `rollout.chat.encode_prompt` gives for the same prefix.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Sequence

GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")


class ChatTemplateError(ValueError):
  """A conversation whose assistant turns the chat template does not let us find."""


@dataclasses.dataclass(frozen=True)
class EncodedConversation:
  ids: list[int]     # the chat template's rendering of the whole conversation
  mask: list[int]    # 1 on the trained tokens (assistant content + end-of-turn EOS)


def mask_method(tokenizer) -> str:
  """'generation' when the chat template marks assistant text with {% generation %}, else 'prefix'."""
  if not tokenizer.chat_template:
    raise ValueError(f"tokenizer {type(tokenizer).__name__} has no chat_template")
  return "generation" if GENERATION_BLOCK.search(tokenizer.chat_template) else "prefix"


def _render(tokenizer, messages, add_generation_prompt: bool) -> str:
  return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                       add_generation_prompt=add_generation_prompt)


def assistant_spans(tokenizer, messages: Sequence[Mapping[str, str]]) -> tuple[str, list[tuple[int, int, int]]]:
  """(the rendered conversation, (message index, start, end) of each assistant turn's characters
  in it): what the template writes after the generation prompt before the turn, through the turn."""
  text = _render(tokenizer, messages, False)
  spans = []
  for i, m in enumerate(messages):
    if m["role"] != "assistant":
      continue
    before, through = _render(tokenizer, messages[:i], True), _render(tokenizer, messages[:i + 1], False)
    if not (text.startswith(before) and text.startswith(through) and len(through) > len(before)):
      raise ChatTemplateError(f"message {i}: the chat template does not render the conversation up "
                              f"to this assistant turn as a prefix of the whole (it rewrites earlier "
                              f"turns), so the turn's tokens cannot be found by prefix rendering")
    spans.append((i, len(before), len(through)))
  return text, spans


def encode_conversation(tokenizer, messages: Sequence[Mapping[str, str]]) -> EncodedConversation:
  """Token ids of the conversation (its chat-template rendering) and the assistant-turn mask."""
  messages = [dict(m) for m in messages]
  if mask_method(tokenizer) == "generation":
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    ids, mask = [int(t) for t in out["input_ids"]], [int(t) for t in out["assistant_masks"]]
    if not any(mask):
      raise ChatTemplateError("the chat template's {% generation %} blocks mark no token")
    return EncodedConversation(ids, mask)
  if not getattr(tokenizer, "is_fast", False):
    raise ValueError(f"prefix rendering needs character offsets, so a fast tokenizer; got "
                     f"{type(tokenizer).__name__}")
  eos = tokenizer.eos_token_id
  if eos is None:
    raise ValueError("the tokenizer has no eos_token_id; assistant turns must end with EOS")
  text, spans = assistant_spans(tokenizer, messages)
  enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
  ids, offsets = [int(t) for t in enc["input_ids"]], enc["offset_mapping"]
  mask = [0] * len(ids)
  for i, start, end in spans:
    inside = [j for j, (s, e) in enumerate(offsets) if s < end and e > start]
    ends = [j for j in inside if ids[j] == eos]
    if not ends:
      raise ChatTemplateError(f"message {i}: the chat template ends this assistant turn without the "
                              f"tokenizer's EOS ({tokenizer.eos_token!r}); the model would not learn "
                              f"to stop")
    for j in inside:
      mask[j] = int(j <= ends[-1])
  return EncodedConversation(ids, mask)

"""Chat conversations for SFT: where they come from, which tokens are trained, and the batches.

Two sources (`config.data.train`):
  gold_conversations  '' (the default): the arithmetic env's tasks (`dockyard.envs.math`,
                      `config.env.math`) as two-turn chats, the env's prompt then its gold answer
                      as the assistant turn: the GRPO SFT warm start's chats (`grpo.sft`), which
                      are packed the same way (`make_batch`).
  read_jsonl          a path: the user's conversations in TRL's / HF's conversational schema, one
                      {"messages": [{"role", "content"}, ...]} a line; a bad record is a
                      `ChatDataError` naming its file and line.

Which tokens are trained: `dockyard.conversation` (the assistant turns' content and end-of-turn EOS,
found from the chat template's own rendering).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from dockyard.conversation import ChatTemplateError, EncodedConversation, encode_conversation
from dockyard.data import jsonl
from dockyard.grpo.sft import gold_messages, pack_conversations
from dockyard.policy import TrainBatch


class ChatDataError(ValueError):
  """A conversation that cannot be trained on; the message starts with where it is."""


@dataclasses.dataclass(frozen=True)
class Conversation:
  messages: tuple[Mapping[str, str], ...]   # {"role", "content"}; at least one assistant turn


def gold_conversations(env, tasks: Sequence[Mapping[str, Any]]) -> list[Conversation]:
  """One chat per task, as the GRPO warm start makes them (`grpo.sft.gold_messages`)."""
  return [Conversation(tuple(gold_messages(env, task))) for task in tasks]


def conversation_from_record(record: Any, where: str) -> Conversation:
  """One {"messages": [...]} record -> a Conversation; errors start with `where`."""
  if not isinstance(record, Mapping) or "messages" not in record:
    got = sorted(record) if isinstance(record, Mapping) else type(record).__name__
    raise ChatDataError(f"{where}: expected a JSON object with 'messages', got {got}")
  messages = record["messages"]
  if not isinstance(messages, list) or not messages:
    raise ChatDataError(f"{where}: 'messages' must be a non-empty list of chat messages")
  out = []
  for i, m in enumerate(messages):
    if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
      raise ChatDataError(f"{where}: message {i} must be {{'role': str, 'content': str}}, got {m!r:.80}")
    if m["role"] == "assistant" and not m["content"]:
      raise ChatDataError(f"{where}: message {i} is an empty assistant turn (nothing to train on)")
    out.append({"role": m["role"], "content": m["content"]})
  if out[0]["role"] == "assistant":
    raise ChatDataError(f"{where}: the conversation starts with an assistant message; the first "
                        f"assistant turn needs something to answer")
  if not any(m["role"] == "assistant" for m in out):
    raise ChatDataError(f"{where}: no assistant message (the loss is on assistant turns only)")
  return Conversation(tuple(out))


def read_jsonl(path: str) -> list[Conversation]:
  """The conversations of a JSONL file (blank lines skipped); raises ChatDataError at the first bad
  line, naming it."""
  return jsonl.read_records(path, conversation_from_record, ChatDataError, "conversations")


def encode_conversations(tokenizer, conversations: Sequence[Conversation],
                         max_seq_len: int) -> list[EncodedConversation]:
  """`encode_conversation` of each; one longer than `max_seq_len` is an error naming it."""
  out = []
  for i, conv in enumerate(conversations):
    try:
      enc = encode_conversation(tokenizer, conv.messages)
    except ChatTemplateError as e:
      raise ChatDataError(f"conversation {i}: {e}") from None
    if len(enc.ids) > max_seq_len:
      raise ValueError(f"conversation {i}: {len(enc.ids)} tokens exceed policy.max_seq_len={max_seq_len}")
    out.append(enc)
  return out


def make_batch(conversations: Sequence[EncodedConversation], pad_id: int, pad_multiple: int = 1) -> TrainBatch:
  """Right-padded rows, the assistant mask as the loss mask: the warm start's packing
  (`grpo.sft.pack_conversations`)."""
  return pack_conversations(conversations, pad_id, pad_multiple)

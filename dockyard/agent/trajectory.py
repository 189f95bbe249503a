"""Token-exact multi-turn trajectories: the ids the engine consumed and produced, turn after turn.

A trajectory is the first prompt's ids, then segments: the tokens the model generated in a turn
(loss mask 1, with the logprob of each as the engine sampled it) and the tokens the chat template
puts around them and around each tool result (loss mask 0). The model's tokens are kept as they
came from the engine, never re-tokenized from their text. What follows a turn is rendered by the
chat template incrementally:

  closing      the template's text after an assistant message's content (`<|im_end|>\\n` in
               ChatML), found once per template with a sentinel message, since a turn that ends
               at the tool call's stop string has not produced it;
  observation  render(conversation + [tool message], add_generation_prompt=True) minus
               render(conversation): taken only after checking that the shorter render is a
               prefix of the longer one.

A template that is not prefix-stable (a render whose earlier part changes when a message is
added) raises `TemplateNotPrefixStable`; the episode then masks the trajectory and counts it
instead of training on ids no render would give (`dockyard.agent.episode`).
`check_against_template` renders the finished conversation in one go and compares ids.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from dockyard.agent.tools import CALL_END, CALL_START, Tool

_SENTINEL = "\x00dockyard-assistant-content\x00"


class TemplateNotPrefixStable(ValueError):
  """Adding a message changed how the template renders the messages before it."""


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
  return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _ids(out) -> list[int]:
  if isinstance(out, Mapping):   # some tokenizers return a BatchEncoding
    out = out["input_ids"]
  return [int(t) for t in out]


def hermes_tools_block(tools: Sequence[Tool]) -> str:
  """The tool instructions for a template that does not render `tools=` itself."""
  specs = "\n".join(json.dumps(t.spec(), ensure_ascii=False) for t in tools)
  return ("# Tools\n\nYou can call functions to act. Their signatures are inside <tools></tools>:\n"
          f"<tools>\n{specs}\n</tools>\n\nTo call one, write a JSON object with its name and "
          f"arguments inside {CALL_START}{CALL_END} tags, then stop and wait for the result:\n"
          f'{CALL_START}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CALL_END}')


class ChatRenderer:
  """Renders a conversation with the tokenizer's chat template and the tools.

  The tools go to the template as `tools=` specs. A template that ignores them (renders the same
  with and without; SmolLM2's and the tiny test model's ChatML do) gets the Hermes tools block
  appended to the system message instead (a system message is added if there is none)."""

  def __init__(self, tokenizer, tools: Sequence[Tool]):
    if not getattr(tokenizer, "chat_template", None):
      raise ValueError(f"ChatRenderer: tokenizer {type(tokenizer).__name__} has no chat_template")
    self.tokenizer, self.tools = tokenizer, tuple(tools)
    self.specs = [t.spec() for t in self.tools]
    probe = [{"role": "user", "content": "probe"}]
    self.native_tools = bool(self.specs) and (self._text(probe, False, self.specs)
                                              != self._text(probe, False, None))
    rendered = self.text([{"role": "user", "content": "u"},
                          {"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False)
    if rendered.count(_SENTINEL) != 1:
      raise ValueError("ChatRenderer: the chat template does not render an assistant message's "
                       "content verbatim, so a turn's closing tokens cannot be derived from it")
    self.closing_text = rendered.split(_SENTINEL)[1]

  def _text(self, messages, add_generation_prompt: bool, tools) -> str:
    return self.tokenizer.apply_chat_template(list(messages), tools=tools, tokenize=False,
                                              add_generation_prompt=add_generation_prompt)

  def _messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    messages = [dict(m) for m in messages]
    if self.native_tools or not self.tools:
      return messages
    block = hermes_tools_block(self.tools)
    if messages and messages[0].get("role") == "system":
      messages[0]["content"] = f"{messages[0]['content']}\n\n{block}"
      return messages
    return [{"role": "system", "content": block}] + messages

  def text(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
    return self._text(self._messages(messages), add_generation_prompt,
                      self.specs if self.native_tools else None)

  def ids(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> list[int]:
    return _ids(self.tokenizer.apply_chat_template(
        self._messages(messages), tools=self.specs if self.native_tools else None, tokenize=True,
        add_generation_prompt=add_generation_prompt, return_dict=False))

  def encode(self, text: str) -> list[int]:
    return _ids(self.tokenizer.encode(text, add_special_tokens=False))


@dataclasses.dataclass
class Trajectory:
  """The ids of one episode. `token_ids` follow `prompt_ids`; `loss_mask[i]` is 1 where the model
  generated `token_ids[i]` (its sampled logprob is `logprobs[i]`; 0.0 elsewhere);
  `weight_versions[i]` is the weight version that generated it (-1 on template tokens)."""
  prompt_ids: list[int]
  token_ids: list[int] = dataclasses.field(default_factory=list)
  loss_mask: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  weight_versions: list[int] = dataclasses.field(default_factory=list)
  # (start, end) in token_ids of each generated segment, and of each template/observation one
  generated: list[tuple[int, int]] = dataclasses.field(default_factory=list)
  observed: list[tuple[int, int]] = dataclasses.field(default_factory=list)

  @property
  def ids(self) -> list[int]:
    """Everything the engine saw: the prompt and every segment since."""
    return self.prompt_ids + self.token_ids

  def __len__(self) -> int:
    return len(self.prompt_ids) + len(self.token_ids)

  def add_generated(self, token_ids: Sequence[int], logprobs: Sequence[float],
                    versions: Sequence[int]) -> None:
    if not len(token_ids) == len(logprobs) == len(versions):
      raise ValueError(f"a generated segment needs one logprob and one weight version per token: "
                       f"{len(token_ids)} tokens, {len(logprobs)} logprobs, {len(versions)} versions")
    start = len(self.token_ids)
    self.token_ids += [int(t) for t in token_ids]
    self.loss_mask += [1] * len(token_ids)
    self.logprobs += [float(x) for x in logprobs]
    self.weight_versions += [int(v) for v in versions]
    self.generated.append((start, len(self.token_ids)))

  def add_observed(self, token_ids: Sequence[int]) -> None:
    start = len(self.token_ids)
    self.token_ids += [int(t) for t in token_ids]
    self.loss_mask += [0] * len(token_ids)
    self.logprobs += [0.0] * len(token_ids)
    self.weight_versions += [-1] * len(token_ids)
    self.observed.append((start, len(self.token_ids)))

  def mask_all(self) -> None:
    """Trains on none of it (a truncated episode under truncation='mask', an unstable template)."""
    self.loss_mask = [0] * len(self.token_ids)


class TrajectoryBuilder:
  """Builds one episode's conversation (messages) and its token-exact trajectory side by side."""

  def __init__(self, renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]]):
    if not messages:
      raise ValueError("TrajectoryBuilder: the first prompt has no messages")
    self.renderer = renderer
    self.messages = [dict(m) for m in messages]
    self.trajectory = Trajectory(prompt_ids=renderer.ids(self.messages, add_generation_prompt=True))
    self._eos = getattr(renderer.tokenizer, "eos_token_id", None)

  def add_turn(self, token_ids: Sequence[int], logprobs: Sequence[float],
               versions: Sequence[int]) -> str:
    """The model's tokens of one turn, as the engine produced them; returns their text (the
    assistant message's content: a final end-of-turn token is not part of it)."""
    self.trajectory.add_generated(token_ids, logprobs, versions)
    content_ids = list(token_ids)
    if content_ids and content_ids[-1] == self._eos:
      content_ids = content_ids[:-1]
    text = self.renderer.tokenizer.decode(content_ids, skip_special_tokens=False)
    self.messages.append({"role": "assistant", "content": text})
    return text

  def observation_ids(self, content: str, role: str = "tool") -> list[int]:
    """The ids that would follow the last turn if a `role` message with `content` came next: the
    turn's closing, the message, the next generation prompt. Raises TemplateNotPrefixStable."""
    if self.messages[-1]["role"] != "assistant":
      raise ValueError("observation_ids: the last message is not the model's turn")
    before = self.renderer.ids(self.messages, add_generation_prompt=False)
    after = self.renderer.ids(self.messages + [{"role": role, "content": content}],
                              add_generation_prompt=True)
    if after[:len(before)] != before:
      at = _first_difference(before, after)
      raise TemplateNotPrefixStable(
          f"adding a {role!r} message changes the render before it (first different id at "
          f"position {at} of {len(before)})")
    closing = self.renderer.encode(self.renderer.closing_text)
    last = self.trajectory.generated[-1]
    if self.trajectory.token_ids[last[1] - 1:last[1]] == [self._eos] and closing[:1] == [self._eos]:
      closing = closing[1:]   # the model ended its turn itself
    return closing + after[len(before):]

  def add_observation(self, ids: Sequence[int], content: str, role: str = "tool") -> None:
    """Appends the ids `observation_ids` gave for this message."""
    self.trajectory.add_observed(ids)
    self.messages.append({"role": role, "content": content})


def check_against_template(renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]],
                           trajectory: Trajectory) -> str | None:
  """None when rendering `messages` in one go gives the trajectory's ids (up to the closing of a
  final turn the model ended itself); otherwise what differs."""
  ends_with_generation = bool(trajectory.generated) and trajectory.generated[-1][1] == len(trajectory.token_ids)
  full = renderer.ids(messages, add_generation_prompt=not ends_with_generation)
  ids = trajectory.ids
  if full[:len(ids)] != ids:
    at = _first_difference(full, ids)
    return (f"the one-go render differs at id {at}: render {full[at:at + 8]} vs trajectory "
            f"{ids[at:at + 8]} ({len(full)} vs {len(ids)} ids)")
  tail = renderer.tokenizer.decode(full[len(ids):], skip_special_tokens=False)
  if tail and not renderer.closing_text.endswith(tail):
    return f"the one-go render has {tail!r} after the trajectory, not the template's closing"
  return None

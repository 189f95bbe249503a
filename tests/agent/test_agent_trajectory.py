"""Token-exact trajectories on the real SmolLM2 tokenizer and the tiny test one: observations are
rendered incrementally by the chat template, the model's ids are kept as generated, the loss mask
covers generated tokens only, and the one-go render of the final conversation gives the same ids."""
import copy

import pytest

from dockyard.agent.tools import SESSION_TOOLS
from dockyard.agent.trajectory import (ChatRenderer, TemplateNotPrefixStable, TrajectoryBuilder,
                                       check_against_template)

FIRST = [{"role": "user", "content": "Fix the bug in calc/core.py, then submit."}]
TURNS = [
    ('<tool_call>\n{"name": "view", "arguments": {"path": "calc/core.py"}}\n</tool_call>',
     "     1\tdef add(a, b):\n     2\t  return a - b"),
    ('It subtracts. <tool_call>\n{"name": "edit", "arguments": {"path": "calc/core.py", '
     '"old_str": "a - b", "new_str": "a + b"}}\n</tool_call>', "edited calc/core.py"),
]


def encode(tokenizer, text):
  return tokenizer.encode(text, add_special_tokens=False)


def build(tokenizer, turns=TURNS, final="Done.", first=FIRST):
  renderer = ChatRenderer(tokenizer, SESSION_TOOLS)
  b = TrajectoryBuilder(renderer, first)
  for k, (said, result) in enumerate(turns):
    ids = encode(tokenizer, said)
    b.add_turn(ids, [-0.1 * (k + 1)] * len(ids), [k] * len(ids))
    b.add_observation(b.observation_ids(result), result)
  ids = encode(tokenizer, final) + [tokenizer.eos_token_id]
  b.add_turn(ids, [-0.5] * len(ids), [7] * len(ids))
  return renderer, b


def test_the_trajectory_is_the_one_go_render_and_masks_generated_tokens_only(tokenizer):
  renderer, b = build(tokenizer)
  t = b.trajectory
  assert check_against_template(renderer, b.messages, t) is None
  assert t.prompt_ids == renderer.ids(FIRST, add_generation_prompt=True)
  assert len(t.generated) == 3 and len(t.observed) == 2
  generated = [i for s, e in t.generated for i in range(s, e)]
  assert [i for i, m in enumerate(t.loss_mask) if m] == generated
  # each generated segment holds exactly the model's ids, with their logprobs and versions
  for k, ((s, e), (said, _)) in enumerate(zip(t.generated, TURNS)):
    assert t.token_ids[s:e] == encode(tokenizer, said)
    assert t.logprobs[s:e] == pytest.approx([-0.1 * (k + 1)] * (e - s))
    assert set(t.weight_versions[s:e]) == {k}
  assert all(t.logprobs[i] == 0.0 and t.weight_versions[i] == -1
             for s, e in t.observed for i in range(s, e))
  # an observation: the closing of the turn, the tool message, the next generation prompt
  s, e = t.observed[0]
  text = tokenizer.decode(t.token_ids[s:e])
  assert text == "<|im_end|>\n<|im_start|>tool\n" + TURNS[0][1] + "<|im_end|>\n<|im_start|>assistant\n"
  assert t.token_ids[-1] == tokenizer.eos_token_id


def test_the_tools_reach_the_prompt_through_a_template_that_ignores_them(tokenizer):
  renderer = ChatRenderer(tokenizer, SESSION_TOOLS)
  assert not renderer.native_tools   # both ChatML templates drop `tools=`
  prompt = tokenizer.decode(renderer.ids(FIRST, add_generation_prompt=True))
  assert prompt.startswith("<|im_start|>system\n# Tools") and '"name": "edit"' in prompt
  with_system = renderer.text([{"role": "system", "content": "Be brief."}] + FIRST, True)
  assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")


def test_a_template_that_renders_tools_gets_them_as_tools(tiny_tokenizer):
  tok = copy.deepcopy(tiny_tokenizer)
  tok.chat_template = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }};"
                       "{% endfor %}<|im_end|>\n{% endif %}" + tiny_tokenizer.chat_template)
  renderer = ChatRenderer(tok, SESSION_TOOLS)
  assert renderer.native_tools
  assert renderer.text(FIRST, True).startswith(
      "<|im_start|>system\nbash;view;edit;create;search;submit;<|im_end|>\n<|im_start|>user\n")
  assert check_against_template(renderer, *(lambda r, b: (b.messages, b.trajectory))(*build(tok))) is None


def test_model_ids_are_kept_as_generated_not_retokenized(tokenizer):
  """A model may sample a non-canonical split of its text; the trajectory keeps the engine's ids
  (and the one-go render, which re-tokenizes the text, is what differs)."""
  said = TURNS[0][0]
  canonical = encode(tokenizer, said)
  split = [t for piece in said for t in encode(tokenizer, piece)]   # one piece per character
  assert split != canonical and tokenizer.decode(split) == said
  renderer = ChatRenderer(tokenizer, SESSION_TOOLS)
  b = TrajectoryBuilder(renderer, FIRST)
  assert b.add_turn(split, [-1.0] * len(split), [0] * len(split)) == said
  b.add_observation(b.observation_ids("ok"), "ok")
  s, e = b.trajectory.generated[0]
  assert b.trajectory.token_ids[s:e] == split
  assert "differs at id" in check_against_template(renderer, b.messages, b.trajectory)


def test_a_turn_ending_mid_token_after_the_stop_string_still_renders(tokenizer):
  """vLLM stops on `</tool_call>` but keeps the whole last token: its text may run past the tag."""
  said = TURNS[0][0] + "\n\n"
  renderer, b = build(tokenizer, turns=[(said, "x")])
  assert b.messages[1]["content"] == said
  assert check_against_template(renderer, b.messages, b.trajectory) is None


def test_a_template_that_is_not_prefix_stable_is_refused(tiny_tokenizer):
  tok = copy.deepcopy(tiny_tokenizer)
  # renders how many messages follow in the system turn: every added message rewrites the start
  tok.chat_template = ("<|im_start|>system\n{{ messages|length }} messages<|im_end|>\n"
                       + tiny_tokenizer.chat_template)
  renderer = ChatRenderer(tok, SESSION_TOOLS)
  b = TrajectoryBuilder(renderer, FIRST)
  ids = encode(tok, TURNS[0][0])
  b.add_turn(ids, [0.0] * len(ids), [0] * len(ids))
  with pytest.raises(TemplateNotPrefixStable, match="changes the render before it"):
    b.observation_ids("x")


def test_generated_segments_need_a_logprob_per_token(tiny_tokenizer):
  b = TrajectoryBuilder(ChatRenderer(tiny_tokenizer, SESSION_TOOLS), FIRST)
  with pytest.raises(ValueError, match="one logprob and one weight version per token"):
    b.add_turn([5, 6], [0.0], [0, 0])

"""The assistant-turn mask (`dockyard.conversation`) on the tiny model's tokenizer and on
SmolLM2-135M-Instruct's, both ChatML templates without {% generation %} blocks (so: prefix
rendering): the mask is exactly each assistant turn's content + its end-of-turn EOS, in multi-turn
chats with and without a system prompt (SmolLM2's template adds a default system turn when there
is none); the ids before each turn are the prompt ids GRPO samples from; a template with
{% generation %} blocks gives the same mask through transformers; templates that break the
method's assumptions are errors naming the message; the GRPO warm start's batch is prompt + gold
answer + EOS with the loss on the answer and EOS."""
import numpy as np
import pytest

from dockyard import conversation
from dockyard.envs import math as math_env
from dockyard.grpo import sft as warm_start
from dockyard.models import tiny
from dockyard.rollout.chat import encode_prompt

SYSTEM = {"role": "system", "content": "You answer in one line."}
CHAT = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "And 12 + 30?"},
    {"role": "assistant", "content": "It is 42."},
]
TOKENIZERS = ["tiny_tokenizer", pytest.param("smollm2_tokenizer", marks=pytest.mark.slow)]


def runs(mask):
  """[start, end) of each run of 1s."""
  m = np.concatenate([[0], np.asarray(mask), [0]])
  edges = np.flatnonzero(np.diff(m))
  return list(zip(edges[0::2], edges[1::2]))


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("system", [False, True])
def test_mask_is_each_assistant_turn_and_its_eos(request, name, system):
  tok = request.getfixturevalue(name)
  messages = ([SYSTEM] if system else []) + CHAT
  assert conversation.mask_method(tok) == "prefix"
  enc = conversation.encode_conversation(tok, messages)
  assert len(enc.ids) == len(enc.mask)
  assert enc.ids == encode_prompt(tok, messages, add_generation_prompt=False)   # the template's own ids
  turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
  spans = runs(enc.mask)
  assert len(spans) == len(turns)
  for (start, end), i in zip(spans, turns):
    # The ids before the turn are what GRPO's rollout samples after (generation prompt included).
    assert enc.ids[:start] == encode_prompt(tok, messages[:i])
    assert enc.ids[end - 1] == tok.eos_token_id
    assert tok.decode(enc.ids[start:end - 1]) == messages[i]["content"]
  # Outside the turns: every system / user word, the role headers, and the newline after each EOS.
  untrained = tok.decode([t for t, m in zip(enc.ids, enc.mask) if not m])
  for m in messages:
    if m["role"] != "assistant":
      assert m["content"] in untrained
  assert untrained.count("assistant\n") == len(turns)
  assert sum(enc.mask) == sum(len(tok.encode(messages[i]["content"], add_special_tokens=False)) + 1
                              for i in turns)


def test_smollm2_default_system_turn_is_context(smollm2_tokenizer):
  tok = smollm2_tokenizer
  enc = conversation.encode_conversation(tok, CHAT)
  text = tok.decode(enc.ids)
  assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
  assert not any(enc.mask[:len(encode_prompt(tok, CHAT[:1]))])


def test_generation_blocks_give_the_same_mask(tiny_tokenizer):
  """A ChatML template whose assistant content and <|im_end|> sit in a {% generation %} block:
  transformers' return_assistant_tokens_mask path, same ids and mask as prefix rendering."""
  tok = tiny_tokenizer
  expected = conversation.encode_conversation(tok, [SYSTEM] + CHAT)
  marked = tok.__class__.from_pretrained(tok.name_or_path)
  marked.chat_template = (
      "{% for message in messages %}"
      "{{ '<|im_start|>' + message['role'] + '\n' }}"
      "{% if message['role'] == 'assistant' %}{% generation %}"
      "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
      "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}"
      "{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
  assert conversation.mask_method(marked) == "generation"
  got = conversation.encode_conversation(marked, [SYSTEM] + CHAT)
  assert got.ids == expected.ids and got.mask == expected.mask


def test_templates_that_hide_the_turns_are_errors(tiny_tokenizer):
  tok = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
  # Drops earlier assistant turns' content (as reasoning templates drop old thinking).
  tok.chat_template = tiny.CHAT_TEMPLATE.replace(
      "message['content']", "(message['content'] if loop.last or message['role'] != 'assistant' else '')")
  with pytest.raises(conversation.ChatTemplateError, match="message 1: .*prefix"):
    conversation.encode_conversation(tok, CHAT)
  # Ends assistant turns with something other than EOS: the model would never learn to stop.
  tok.chat_template = tiny.CHAT_TEMPLATE.replace("'<|im_end|>'", "'<|endoftext|>'")
  with pytest.raises(conversation.ChatTemplateError, match="message 1: .*EOS"):
    conversation.encode_conversation(tok, CHAT)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_warm_start_batch_is_prompt_gold_eos(request, name):
  """The GRPO warm start (and configs/sft.py's default data) train the gold answer + EOS after the
  env's chat prompt, as the sampler will see it."""
  tok = request.getfixturevalue(name)
  env = math_env.MathEnv(math_env.MathConfig(num_train=12, num_validation=0, gold_format="equation"))
  batch = warm_start.make_sft_batch(env, tok, env.train, pad_multiple=16)
  assert batch.input_ids.shape[1] % 16 == 0
  for row, task in enumerate(env.train):
    prompt = encode_prompt(tok, env.prompt_messages(task))
    answer = tok.encode(env.gold_completion(task), add_special_tokens=False) + [tok.eos_token_id]
    n = len(prompt) + len(answer)
    assert batch.input_ids[row, :len(prompt)].tolist() == prompt
    assert batch.input_ids[row, len(prompt):n].tolist() == answer
    assert batch.loss_mask[row].tolist() == [0.0] * len(prompt) + [1.0] * len(answer) + [0.0] * (
        batch.input_ids.shape[1] - n)
    assert batch.attention_mask[row].sum() == n + 1   # the template's newline after EOS: context

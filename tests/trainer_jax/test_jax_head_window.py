"""The LM head only where the loss reads (`train.windowed_logprobs`, `JaxPolicy._head_window`): a
GRPO-shaped batch (prompts of different lengths, the loss on each row's completion) takes the same
step with the head run on a window of positions as with the head run everywhere (loss, every
metric, grad norm, updated parameters; fp32, 1e-5), for the GRPO loss with its KL term and the SFT
NLL, tied and untied heads, and LoRA; the window (as wide as config.rollout.max_new_tokens) covers
every loss position and is left out where a row's loss does not fit in it, it would save little, or
the loss needs the full logits."""
import numpy as np
import pytest

from dockyard.policy import TrainBatch
from dockyard.trainer_jax.loss import nll_loss
from tests.trainer_jax.test_jax_packing import _with_pg_extras
from tests.trainer_jax.test_jax_token_budget import PG, _assert_same_step, _params, _policy, topk_loss


def _grpo_batch(vocab, prompts, completions, t, seed=0):
  """Rows of a prompt then a completion, right-padded to t; the loss on the completion."""
  rng = np.random.default_rng(seed)
  b = len(prompts)
  ids = rng.integers(3, vocab, (b, t)).astype(np.int32)
  attn, loss = np.zeros_like(ids), np.zeros((b, t), np.float32)
  for i, (p, c) in enumerate(zip(prompts, completions)):
    attn[i, :p + c], ids[i, p + c:], loss[i, p:p + c] = 1, 0, 1
  return TrainBatch(ids, attn, loss, extras={"advantages": rng.standard_normal(b).astype(np.float32)})


PROMPTS, COMPLETIONS = [40, 23, 51, 9, 33], [12, 16, 5, 14, 1]   # completions <= 16 tokens


@pytest.mark.parametrize("family,lora", [("qwen2", False), ("llama", False), ("qwen2", True)])
def test_windowed_head_takes_the_same_step(tiny_models, config, family, lora):
  path = tiny_models[family]
  config.rollout.max_new_tokens = 16                        # the window: 16 of T = 64
  windowed, full = _policy(path, config, lora=lora), _policy(path, config, lora=lora)
  full._head_window = lambda batch, shape: None            # the head everywhere
  vocab = windowed.model.config.vocab_size
  batch = _grpo_batch(vocab, PROMPTS, COMPLETIONS, t=64)
  window = np.asarray(windowed._head_window(batch, (2, 4, 64))).reshape(8, -1)
  assert window.shape == (8, 16) and window.min() >= 1 and window.max() <= 63
  for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS)):   # every loss position inside its row's window
    assert set(range(p, p + c)) <= set(window[i].tolist()), (i, window[i])
  for loss_fn in (PG, nll_loss):
    step_batch = _with_pg_extras(batch, full.logprobs(batch)) if loss_fn is PG else batch
    a, b = windowed.train_step(step_batch, loss_fn), full.train_step(step_batch, loss_fn)
    assert a["grad_norm"] > 0
    _assert_same_step(a, b, _params(windowed), _params(full))


def test_window_left_out_where_it_saves_little_or_the_loss_needs_all_logits(tiny_models, config):
  config.rollout.max_new_tokens = 16
  policy = _policy(tiny_models["qwen2"], config)
  vocab = policy.model.config.vocab_size
  # a row whose loss spans 17 tokens (longer than a completion: a multi-turn episode)
  assert policy._head_window(_grpo_batch(vocab, [10, 20], [17, 3], t=64), (1, 4, 64)) is None
  # the window more than half the padded length
  assert policy._head_window(_grpo_batch(vocab, [10, 2], [6, 3], t=16), (1, 4, 16)) is None
  # a row ending at the last position: the window moves left, stays inside the row and past 0
  w = np.asarray(policy._head_window(_grpo_batch(vocab, [60, 1], [4, 2], t=64), (1, 4, 64)))[0]
  assert w[0].tolist() == list(range(48, 64)) and w[1].tolist() == list(range(1, 17))
  # no window configured
  config.rollout.max_new_tokens = 0
  assert _policy(tiny_models["qwen2"], config)._head_window(_grpo_batch(vocab, [40], [4], t=64), (1, 4, 64)) is None
  # top-k distillation reads the full logits
  batch = _grpo_batch(vocab, PROMPTS, COMPLETIONS, t=64)
  topk = TrainBatch(batch.input_ids, batch.attention_mask, batch.loss_mask,
                    extras=dict(batch.extras, topk_ids=np.zeros((5, 64, 2), np.int32)))
  assert policy._head_window(topk, (2, 4, 64)) is None
  assert policy.train_step(topk, topk_loss)["grad_norm"] > 0

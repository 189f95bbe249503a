"""On-policy distillation's two ways of combining teachers (`grpo.distill.combine`: the weighted
sum, or one teacher per prompt chosen by selection) and its teacher with another tokenizer (aligned
on text spans, `dockyard.distill.SpanAlignedTeacher`): the span alignment on hand-made offsets and
on two locally trained tokenizers whose segmentations differ, the targets checked by hand, the
same-tokenizer case equal to the plain teacher, and the selection rule on constructed cases."""
import numpy as np
import pytest

from dockyard import validate
from dockyard.distill import (SpanAlignedTeacher, align_spans, char_ends, teacher_row_weights, teacher_topk,
                              token_advantages, topk_kl_loss)
from dockyard.grpo.batch import pack_sequences
from tests.config_overrides import with_overrides

CORPUS = [" ".join(f"What is {a} + {b}? {a + b}" for b in range(10)) for a in range(10)]


@pytest.fixture(scope="module")
def other_tokenizer(tmp_path_factory):
  """A second byte-level BPE tokenizer on the conftest tokenizer's corpus with fewer merges: the
  same special tokens and chat template, another vocabulary (e.g. ' 12' is one token there, two
  here)."""
  from transformers import AutoTokenizer

  from dockyard.models import tiny
  out = str(tmp_path_factory.mktemp("tok270"))
  tiny.train_tokenizer(out, vocab_size=270, corpus=CORPUS)
  return AutoTokenizer.from_pretrained(out)


class TokenTable:
  """A teacher `Policy` whose logprob of a token depends on its id alone; keeps the batch it got."""
  def __init__(self):
    self.batch = None

  @staticmethod
  def lp(ids):
    return -0.1 * (1 + np.asarray(ids) % 7)

  def logprobs(self, batch):
    self.batch = batch
    return self.lp(batch.input_ids) * batch.attention_mask


def _ids(tokenizer, *tokens):
  ids = tokenizer.convert_tokens_to_ids(list(tokens))
  assert None not in ids and tokenizer.unk_token_id not in ids, tokens
  return ids


def _student_batch(tokenizer, completions, temperature=0.7):
  """Rows: the chat prompt of a question, then each completion (token ids as sampled)."""
  prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}],
                                         add_generation_prompt=True, tokenize=False)
  prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
  batch = pack_sequences([prompt_ids] * len(completions), completions, pad_id=0, pad_multiple=16)
  batch.temperature = temperature
  return batch, len(prompt_ids)


def test_align_spans_on_hand_made_offsets():
  # the boundaries coincide: one token a span on each side
  s, t, n = align_spans([2, 5, 8], [2, 5, 8], 8)
  assert n == 3 and list(s) == [0, 1, 2] and list(t) == [0, 1, 2]
  # a teacher token over two student tokens, and the reverse
  s, t, n = align_spans([2, 5, 8], [5, 8], 8)
  assert n == 2 and list(s) == [0, 0, 1] and list(t) == [0, 1]
  s, t, n = align_spans([5, 8], [2, 5, 8], 8)
  assert n == 2 and list(s) == [0, 1] and list(t) == [0, 0, 1]
  # crossing boundaries (3 | 5) merge into one span up to the next common one
  s, t, n = align_spans([3, 8, 10], [5, 8, 10], 10)
  assert n == 2 and list(s) == [0, 0, 1] and list(t) == [0, 0, 1]
  # a token that adds no text (ends where the previous one did) joins the span of its end
  s, t, n = align_spans([0, 3, 3, 6], [3, 6], 6)
  assert n == 2 and list(s) == [0, 0, 0, 1] and list(t) == [0, 1]


def test_char_ends_reads_partial_characters_and_whitespace(tokenizer):
  # 'é' is two byte-level tokens here; the first decodes to U+FFFD alone and ends with the second
  ids = tokenizer("héllo 12", add_special_tokens=False)["input_ids"]
  text, ends = char_ends(tokenizer, ids)
  assert text == "héllo 12"
  assert ends == [1, 2, 2, 3, 4, 5, 8]
  # decoded in pieces of 1-3 tokens (cuts inside 'é' grow to the next cut): the same ends
  for chunk in (1, 2, 3):
    assert char_ends(tokenizer, ids, chunk=chunk) == (text, ends)
  # a leading space and a lone space token are characters of their own token
  text, ends = char_ends(tokenizer, _ids(tokenizer, "Ġ", "=", "Ġ12"))
  assert text == " = 12" and ends == [1, 2, 5]


def test_another_tokenizer_s_targets_by_hand(tokenizer, other_tokenizer):
  """Student tokens ' 12 + 3 = 15' <|im_end|> (here: 'Ġ12 Ġ+ Ġ3 Ġ = Ġ15'); the teacher's tokenizer
  cuts ' 1|2', ' |3', ' 1|5'. Every student token is a span, so its target is the teacher's span
  logprob; the EOS maps to the teacher's <|im_end|>; the teacher reads the prompt its own way."""
  student_tok, teacher_tok = tokenizer, other_tokenizer
  completion = _ids(student_tok, "Ġ12", "Ġ+", "Ġ3", "Ġ", "=", "Ġ15", "<|im_end|>")
  batch, p = _student_batch(student_tok, [completion])
  policy = TokenTable()
  teacher = SpanAlignedTeacher(policy, teacher_tok, student_tok)
  student_lp = np.where(batch.loss_mask > 0, -0.5, 0.0)
  target, metrics = teacher.aligned_logprobs(batch, student_lp)
  lp = lambda *tokens: float(TokenTable.lp(_ids(teacher_tok, *tokens)).sum())
  want = [lp("Ġ1", "2"), lp("Ġ+"), lp("Ġ", "3"), lp("Ġ"), lp("="), lp("Ġ1", "5"), lp("<|im_end|>")]
  np.testing.assert_allclose(target[0, p:p + 7], want, atol=1e-12)
  assert np.all(target[0, :p] == 0) and np.all(target[0, p + 7:] == 0)
  assert metrics == {"unaligned_frac": 0.0, "student_tokens_per_span": 1.0}
  # what the teacher scored: the prompt and the completion, tokenized its own way, at T = 0.7
  row = policy.batch.input_ids[0][policy.batch.attention_mask[0] > 0]
  assert teacher_tok.decode(row, skip_special_tokens=False) == student_tok.decode(
      batch.input_ids[0][batch.attention_mask[0] > 0], skip_special_tokens=False)
  assert row[-1] == teacher_tok.convert_tokens_to_ids("<|im_end|>") and policy.batch.temperature == 0.7


def test_a_teacher_token_over_two_student_tokens_shares_its_log_ratio(tokenizer, other_tokenizer):
  """The reverse direction: the student (the 270-token tokenizer) sampled ' 1' '2' where the
  teacher has ' 12': the two student tokens share the span's log-ratio evenly, so their gaps sum
  to the span's student-minus-teacher logprob and the single-token spans get the teacher's logprob."""
  student_tok, teacher_tok = other_tokenizer, tokenizer
  completion = _ids(student_tok, "Ġ1", "2", "Ġ+", "Ġ", "3", "<|im_end|>")   # ' 12 + 3'
  batch, p = _student_batch(student_tok, [completion])
  s = np.zeros(batch.input_ids.shape)
  s[0, p:p + 6] = [-1.0, -2.0, -0.3, -0.7, -0.2, -0.4]
  target, metrics = SpanAlignedTeacher(TokenTable(), teacher_tok, student_tok).aligned_logprobs(batch, s)
  lp = lambda tok: float(TokenTable.lp(_ids(teacher_tok, tok))[0])
  t12, t3 = lp("Ġ12"), lp("Ġ3")   # the teacher cuts ' 3' where the student cut ' ' '3'
  share12, share3 = (t12 - (-3.0)) / 2, (t3 - (-0.9)) / 2
  want = [-1.0 + share12, -2.0 + share12, lp("Ġ+"), -0.7 + share3, -0.2 + share3, lp("<|im_end|>")]
  np.testing.assert_allclose(target[0, p:p + 6], want, atol=1e-12)
  gap = s[0, p:p + 6] - target[0, p:p + 6]
  assert gap[0] == pytest.approx(gap[1]) and gap[0] + gap[1] == pytest.approx(-3.0 - t12)
  assert metrics["student_tokens_per_span"] == pytest.approx(6 / 4)


def test_the_same_tokenizer_gives_the_teacher_s_own_logprobs(tokenizer):
  """Aligned against itself (the sampled tokens being the tokenizer's own cut), every span is one
  token and the teacher sees the student's rows: the targets are the plain teacher's logprobs.
  Sampled tokens that are not the tokenizer's own cut ('Ġ1' '2' for ' 12') re-tokenize to one
  token: the span keeps the sum, split evenly."""
  canonical = tokenizer(" 12 + 3 = 15", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
  odd = _ids(tokenizer, "Ġ1", "2") + canonical[1:]
  batch, p = _student_batch(tokenizer, [canonical, odd])
  s = np.where(batch.loss_mask > 0, -0.25, 0.0)
  s[1, p] = -1.5
  policy = TokenTable()
  target, metrics = SpanAlignedTeacher(policy, tokenizer, tokenizer).aligned_logprobs(batch, s)
  plain = TokenTable.lp(batch.input_ids) * batch.loss_mask
  np.testing.assert_allclose(target[0], plain[0], atol=1e-12)
  np.testing.assert_array_equal(policy.batch.input_ids[0, :batch.input_ids.shape[1]][batch.attention_mask[0] > 0],
                                batch.input_ids[0][batch.attention_mask[0] > 0])
  np.testing.assert_allclose(target[1, p + 2:], plain[1, p + 2:], atol=1e-12)
  share = (float(TokenTable.lp(canonical[0])) - (-1.5 - 0.25)) / 2
  np.testing.assert_allclose(target[1, p:p + 2], [-1.5 + share, -0.25 + share], atol=1e-12)
  assert metrics["unaligned_frac"] == 0.0


def test_a_special_token_the_teacher_lacks_is_left_out(tokenizer, tmp_path):
  """A student special token with no counterpart in the teacher's vocabulary (and not the EOS)
  gets the student's own logprob as target (no signal) and is counted as unaligned."""
  from transformers import AutoTokenizer
  tokenizer.save_pretrained(str(tmp_path / "s"))
  student_tok = AutoTokenizer.from_pretrained(str(tmp_path / "s"))
  student_tok.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
  tool = student_tok.convert_tokens_to_ids("<|tool|>")
  completion = [tool] + tokenizer(" 12", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
  batch, p = _student_batch(student_tok, [completion])
  s = np.where(batch.loss_mask > 0, -0.3, 0.0)
  target, metrics = SpanAlignedTeacher(TokenTable(), tokenizer, student_tok).aligned_logprobs(batch, s)
  assert target[0, p] == -0.3
  np.testing.assert_allclose(target[0, p + 1:p + 3], TokenTable.lp(completion[1:]), atol=1e-12)
  assert metrics["unaligned_frac"] == pytest.approx(1 / 3)


class Fixed:
  def __init__(self, lp):
    self.lp = np.asarray(lp, np.float32)

  def logprobs(self, batch):
    return self.lp


class TopK(Fixed):
  """A teacher with given logprobs of the sampled tokens and a given top k."""
  def __init__(self, lp, ids, topk):
    super().__init__(lp)
    self.ids, self.topk = ids, np.asarray(topk, np.float32)

  def topk_logprobs(self, batch, k):
    return self.ids, self.topk


def test_selection_gives_each_group_the_teacher_that_finds_it_most_likely():
  """Two groups of two rows: teacher 1 scores group 0's tokens higher on average, teacher 0 group
  1's (though teacher 1 has the single most likely token there); padding and prompt positions
  (mask 0) do not count."""
  m = np.array([[0, 1, 1], [0, 1, 0], [0, 1, 1], [0, 1, 1]], np.float32)
  t0 = np.array([[-9, -2, -2], [-9, -2, 0], [9, -1, -1], [9, -1, -1]])
  t1 = np.array([[0, -1, -1], [0, -1, -9], [-9, -0.1, -3], [-9, -3, -3]])
  rows, metrics = teacher_row_weights([t0, t1], m, (0.5, 0.5), "select", [2, 2])
  np.testing.assert_array_equal(rows, [[0, 1], [0, 1], [1, 0], [1, 0]])
  assert metrics == {"distill/selected_teacher_0": 0.5, "distill/selected_teacher_1": 0.5}
  weighted, none = teacher_row_weights([], m, (0.25, 0.75), "weighted")
  np.testing.assert_array_equal(weighted, [[0.25, 0.75]] * 4) and not none
  with pytest.raises(ValueError, match="group sizes"):
    teacher_row_weights([t0, t1], m, (0.5, 0.5), "select", [2, 1])

  # the sampled-token estimator's target is the selected teacher's logprob, row by row
  from dockyard.policy import TrainBatch
  batch = TrainBatch(np.zeros((4, 3), np.int32), np.ones((4, 3), np.int32), m,
                     {"prev_logprobs": -0.5 * m, "advantages": np.zeros(4, np.float32)})
  _, got = token_advantages(batch, Fixed(-0.5 * m), [Fixed(t0), Fixed(t1)], (0.5, 0.5), 0.0, "select", [2, 2])
  want = (np.concatenate([t1[:2], t0[2:]]) * m).sum() / m.sum()
  assert got["distill/teacher_logprob_mean"] == pytest.approx(want)
  assert got["distill/selected_teacher_1"] == 0.5

  # the top-k KL: one-hot rows, so the loss is each row's selected teacher's KL
  rng = np.random.default_rng(0)
  topk = [np.log(rng.dirichlet(np.ones(4), size=(4, 3))[..., :2]) for _ in range(2)]
  ids = np.zeros((4, 3, 2), np.int64)
  extras, metrics = teacher_topk(batch, [TopK(t0, ids, topk[0]), TopK(t1, ids, topk[1])], 2, (0.5, 0.5),
                                 "select", [2, 2])
  np.testing.assert_array_equal(extras["teacher_weights"], rows)
  student = np.log(rng.dirichlet(np.ones(5), size=(4, 3))[..., :4])
  loss, _ = topk_kl_loss(student, m, extras, (0.5, 0.5))
  by_row = [topk_kl_loss(student[r:r + 1, :, 2 * i:2 * i + 2], m[r:r + 1],
                         {"teacher_topk_logprobs": extras["teacher_topk_logprobs"][r:r + 1, :, 2 * i:2 * i + 2],
                          "total_tokens": m.sum()}, (1.0,))[0]
            for r, i in enumerate([1, 1, 0, 0])]
  assert loss == pytest.approx(sum(by_row), abs=1e-12)


def _tokenizer_dir(path, tokenizer):
  """An HF-looking model directory (config.json + the tokenizer files) for validation, which
  reads no weights."""
  from dockyard.models import tiny
  tokenizer.save_pretrained(str(path))
  tiny.make_hf_config({**tiny.DEFAULT_SPEC, "vocab_size": len(tokenizer)}).save_pretrained(str(path))
  return str(path)


def test_validation_names_the_combine_keys_and_the_top_k_kl_across_tokenizers(tokenizer, other_tokenizer, tmp_path):
  for override, key in [({"grpo.distill.combine": "vote"}, "grpo.distill.combine"),
                        ({"grpo.distill.combine": "select", "grpo.distill.weights": (1.0,)}, "grpo.distill.weights")]:
    with pytest.raises(validate.ConfigError, match=key.replace(".", r"\.")):
      validate.validate(with_overrides("configs/distill.py", override))
  student = _tokenizer_dir(tmp_path / "student", tokenizer)
  same = _tokenizer_dir(tmp_path / "same", tokenizer)
  other = _tokenizer_dir(tmp_path / "other", other_tokenizer)
  base = {"policy.model_name_or_path": student, "policy.tiny.tokenizer_from": ""}
  with pytest.raises(validate.ConfigError, match=r"grpo\.distill\.loss.*another tokenizer"):
    validate.validate(with_overrides("configs/distill.py", {**base, "grpo.distill.teachers": (same, other)}))
  for override in ({"grpo.distill.teachers": (same,)},
                   {"grpo.distill.teachers": (same, other), "grpo.distill.loss": "sampled_token",
                    "grpo.distill.combine": "select"}):
    validate.validate(with_overrides("configs/distill.py", {**base, **override}))


def test_the_build_refuses_the_top_k_kl_with_another_tokenizer(tokenizer, other_tokenizer, tmp_path):
  """A tiny student trains its tokenizer at build time, so validation cannot compare it: the build
  names the key before any teacher loads."""
  from dockyard import policy_factory
  other = _tokenizer_dir(tmp_path / "other", other_tokenizer)
  config = with_overrides("configs/distill.py", {"grpo.distill.teachers": (other,)})
  with pytest.raises(validate.ConfigError, match=r"grpo\.distill\.loss.*another tokenizer"):
    policy_factory.make_update(config, tokenizer)
  assert policy_factory._other_tokenizer(_tokenizer_dir(tmp_path / "same", tokenizer), tokenizer) is None
  assert policy_factory._other_tokenizer(other, tokenizer).get_vocab() == other_tokenizer.get_vocab()

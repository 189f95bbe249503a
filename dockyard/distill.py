"""On-policy distillation: the GRPO loop's own samples, scored by frozen teachers.

`grpo.objective='distill'` (configs/distill.py) keeps the one GRPO loop (the student samples
completions of the environment's prompts with the vLLM engines; the environment still scores them,
for the reward curves and validation) and takes this update on each step's groups, with one of
two losses (`grpo.distill.loss`):

- 'topk_kl' (default): every teacher gives its top k tokens per position of the student's samples
  and their logprobs (`Policy.topk_logprobs`, at the sampling temperature T); the trainer hands the
  loss the student's logprobs of the same ids (the top-k contract of `dockyard.policy`), and the
  loss is, per token, the reverse KL(student || teacher) between the two distributions coarsened to
  the teacher's k tokens plus one bucket for everything else (`topk_kl_loss`, the NumPy spec),
  summed over teachers with their `weights`, a token mean over the batch. A dense signal: every
  position moves toward the teacher's whole top k, not only the sampled token. The bucket keeps it a
  proper KL without renormalizing either side over the k (a lower bound of the full reverse KL;
  NeMo-RL's top-k distillation and GKD are the peers read first). `reward_weight` > 0 adds that
  multiple of the loop's clipped policy-gradient loss on the env reward's group advantages.
- 'sampled_token': the per-token estimate on the sampled tokens alone,
    d_t = log p_student(x_t | x_<t) - sum_i w_i log p_teacher_i(x_t | x_<t),
  each token's advantage A_t = mean(d) - d_t over the batch's tokens (+ reward_weight x the group
  advantage of the env reward), trained with the loop's clipped policy-gradient loss. With one
  optimizer step a batch its gradient is E[sum_t A_t grad log p(x_t)]: the "advantage-style"
  per-token reverse KL (Agarwal et al. 2024 GKD with lambda=1; Thinking Machines' 2025 recipe).
  Several teachers: the weighted sum of their logprobs (the normalized geometric mixture).

Several teachers are combined per row (`teacher_row_weights`, `grpo.distill.combine`): 'weighted'
gives every row the config's `weights`; 'select' gives each group (a prompt's n samples) one-hot
weights on the teacher that scores the group's sampled tokens highest (the mean per-token logprob).
Both losses read these [B, M] weights; there is one path for both ways of combining.

A teacher with another tokenizer (`SpanAlignedTeacher`, sampled_token only) reads the student's
completion as text, tokenized its own way, and is compared on the coarsest text spans where both
tokenizations have a boundary (`align_spans`): each student token of a span carries an equal share
of the span's log-ratio, so the sum over a completion is the sequence-level log-ratio.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from dockyard.grpo.batch import pack_sequences
from dockyard.grpo.step import PAD_MULTIPLE, Update, train_on_groups
from dockyard.policy import Policy, TrainBatch

# The top-k KL's floor for the "rest" bucket's mass (1 - the top-k mass): keeps its log finite
# where the top k hold (nearly) everything, in float32.
REST_FLOOR = 1e-6


def topk_kl_loss(topk_logprobs, loss_mask, extras, weights: Sequence[float]):
  """The top-k KL, in NumPy: the spec `dockyard.trainer_jax.loss.topk_kl_loss` and
  `dockyard.trainer_torch.loss.topk_kl_loss` follow (tests/trainer_torch/test_topk_distill.py).

  extras: `teacher_topk_logprobs` [B, T, M*K] (teacher i's top-k at [..., i*K:(i+1)*K]), the
  whole batch's `total_tokens` (the micro-batching contract), `topk_logprobs` [B, T, M*K]:
  the student's logprobs of the same ids (the trainer adds it; the only term with gradient), and
  `teacher_weights` [B, M], each row's weights of the teachers (`teacher_row_weights`: the
  `weights` on every row, or one-hot per group under selection); absent, every row has `weights`.
  Per token and teacher, over the K tokens and a (K+1)-th bucket "everything else":
    KL_i = sum_j p_j (log p_j - log q_j) + p_rest (log p_rest - log q_rest)
  with p the student's, q the teacher's probabilities, p_rest = max(1 - sum_j p_j, REST_FLOOR):
  the reverse KL between the two distributions coarsened to the teacher's top k (exact on that
  partition, a lower bound of the full reverse KL). loss = sum_{b,t} m sum_i w_{b,i} KL_i / N_tok.
  Metrics: `topk_kl` (= loss), `topk_student_mass` (sum_j p_j, token mean, of teacher 0's top k)."""
  m = np.asarray(loss_mask, np.float64)
  student = np.asarray(topk_logprobs, np.float64)
  teacher = np.asarray(extras["teacher_topk_logprobs"], np.float64)
  n = max(float(extras.get("total_tokens", m.sum())), 1.0)
  k = student.shape[-1] // len(weights)
  rows = extras.get("teacher_weights")
  rows = (np.asarray(rows, np.float64) if rows is not None
          else np.tile(np.asarray(weights, np.float64), (m.shape[0], 1)))
  per_token = np.zeros(m.shape)
  mass0 = None
  for i in range(len(weights)):
    s, q = student[..., i * k:(i + 1) * k], teacher[..., i * k:(i + 1) * k]
    ps, pq = np.exp(s), np.exp(q)
    rest_s = np.maximum(1.0 - ps.sum(-1), REST_FLOOR)
    rest_q = np.maximum(1.0 - pq.sum(-1), REST_FLOOR)
    kl = (ps * (s - q)).sum(-1) + rest_s * (np.log(rest_s) - np.log(rest_q))
    per_token += rows[:, i, None] * kl
    mass0 = ps.sum(-1) if mass0 is None else mass0
  loss = float((per_token * m).sum() / n)
  return loss, {"topk_kl": loss, "topk_student_mass": float((mass0 * m).sum() / n)}


COMBINES = ("weighted", "select")


def teacher_row_weights(scores: Sequence[np.ndarray], loss_mask, weights: Sequence[float], combine: str,
                        group_sizes: Sequence[int] | None = None) -> tuple[np.ndarray, dict[str, float]]:
  """Each row's weights of the M teachers, [B, M], and the selection's metrics.

  'weighted': `weights` on every row. 'select': per group (`group_sizes` consecutive rows, a prompt's
  n samples; None: the batch is one group), all weight on the teacher whose `scores` (its logprob of
  each sampled token, at the student's positions, [B, T]) have the highest mean over the group's loss
  tokens: the teacher that finds the group's completions most likely, i.e. the one most at home
  with that prompt (ties: the first). Logged: `distill/selected_teacher_<i>`, the fraction of groups
  given to teacher i."""
  m = np.asarray(loss_mask, np.float64)
  b, count = m.shape[0], len(weights)
  if combine == "weighted":
    return np.tile(np.asarray(weights, np.float64), (b, 1)), {}
  if combine != "select":
    raise ValueError(f"grpo.distill.combine: must be one of {COMBINES}, got {combine!r}")
  if len(scores) != count:
    raise ValueError(f"{len(scores)} teacher scores for {count} teachers")
  sizes = [b] if group_sizes is None else [int(n) for n in group_sizes]
  if sum(sizes) != b:
    raise ValueError(f"group sizes {sizes} do not add up to the batch's {b} rows")
  rows, chosen, start = np.zeros((b, count)), np.zeros(count), 0
  for n in sizes:
    part = slice(start, start + n)
    tokens = max(float(m[part].sum()), 1.0)
    means = [float((np.asarray(sc, np.float64)[part] * m[part]).sum()) / tokens for sc in scores]
    best = int(np.argmax(means))
    rows[part, best] = 1.0
    chosen[best] += 1
    start += n
  return rows, {f"distill/selected_teacher_{i}": float(chosen[i] / len(sizes)) for i in range(count)}


def teacher_logprobs(batch: TrainBatch, teachers: Sequence, student_lp: np.ndarray
                     ) -> tuple[list[np.ndarray], dict[str, float]]:
  """Every teacher's logprob of each sampled token at the student's positions ([B, T] float64):
  `Policy.logprobs` for a teacher that shares the student's tokenizer; the span-aligned estimate
  of `SpanAlignedTeacher` for one that does not (its metrics prefixed `distill/teacher<i>/`)."""
  out, metrics = [], {}
  for i, t in enumerate(teachers):
    if isinstance(t, SpanAlignedTeacher):
      lp, aligned = t.aligned_logprobs(batch, student_lp)
      metrics.update({f"distill/teacher{i}/{k}": v for k, v in aligned.items()})
      out.append(lp)
    else:
      out.append(np.asarray(t.logprobs(batch), np.float64))
  return out, metrics


def token_advantages(batch: TrainBatch, student: Policy, teachers: Sequence,
                     weights: Sequence[float], reward_weight: float, combine: str = "weighted",
                     group_sizes: Sequence[int] | None = None) -> tuple[dict, dict[str, float]]:
  """The sampled-token estimator's extras ({'advantages' [B, T], 'prev_logprobs' [B, T]}) and
  metrics, for a batch holding the groups' sequence `advantages` [B] (and `prev_logprobs`, the
  student before this update, where the step computed them; else scored here). The target is each
  row's `teacher_row_weights` sum of the teachers' logprobs."""
  m = batch.loss_mask
  prev = batch.extras.get("prev_logprobs")
  if prev is None:
    prev = np.asarray(student.logprobs(batch), np.float32) * m
  student_lp = np.asarray(prev, np.float64)
  targets, metrics = teacher_logprobs(batch, teachers, student_lp)
  rows, selected = teacher_row_weights(targets, m, weights, combine, group_sizes)
  target = sum(rows[:, i, None] * lp for i, lp in enumerate(targets)) * m
  gap = (student_lp - target) * m   # d_t: the per-token reverse-KL estimate
  n = max(float(m.sum()), 1.0)
  kl = float(gap.sum() / n)
  # -d_t less its batch mean: a constant baseline (E[grad log p] = 0, so the gradient stays
  # unbiased), without which every token's advantage has the sign of -KL and an optimizer that
  # normalizes per coordinate (Adam) also moves the logits of tokens nobody sampled.
  adv = (kl - gap) * m + float(reward_weight) * np.asarray(batch.extras["advantages"], np.float64)[:, None] * m
  extras = {"advantages": adv.astype(np.float32), "prev_logprobs": np.asarray(prev, np.float32)}
  return extras, {"distill/reverse_kl": kl, "distill/teacher_logprob_mean": float(target.sum() / n),
                  **metrics, **selected}


def teacher_topk(batch: TrainBatch, teachers: Sequence[Policy], k: int, weights: Sequence[float] = (1.0,),
                 combine: str = "weighted", group_sizes: Sequence[int] | None = None
                 ) -> tuple[dict, dict[str, float]]:
  """The top-k KL's extras: every teacher's top k per position, side by side ({'topk_ids',
  'teacher_topk_logprobs'} [B, T, M*K]), each row's `teacher_weights` [B, M]
  (`teacher_row_weights`; selection scores the sampled tokens with every teacher's `logprobs`, one
  more forward pass each), and the teachers' top-k mass (token mean, teacher 0)."""
  ids, lps = zip(*(t.topk_logprobs(batch, k) for t in teachers))
  m = batch.loss_mask
  scores = [np.asarray(t.logprobs(batch), np.float64) for t in teachers] if combine == "select" else []
  rows, selected = teacher_row_weights(scores, m, weights, combine, group_sizes)
  mass = float((np.exp(lps[0]).sum(-1) * m).sum() / max(float(m.sum()), 1.0))
  return ({"topk_ids": np.concatenate(ids, -1).astype(np.int32),
           "teacher_topk_logprobs": np.concatenate(lps, -1).astype(np.float32),
           "teacher_weights": rows.astype(np.float32)},
          {"distill/teacher_topk_mass": mass, **selected})


# --- a teacher with another tokenizer: alignment on text spans ---------------------------------

def align_spans(student_ends: Sequence[int], teacher_ends: Sequence[int], length: int
                ) -> tuple[np.ndarray, np.ndarray, int]:
  """The coarsest common segmentation of one text by two tokenizations.

  Student token i covers the text's characters up to `student_ends[i]` (from the previous token's
  end), teacher token j up to `teacher_ends[j]` (both non-decreasing). The common boundaries are
  the positions where a student token and a teacher token both end, and the text's end `length`;
  span k covers the characters between boundaries k-1 and k, and no token of either side straddles
  one. Returns each student token's span, each teacher token's span and the number of spans."""
  s = np.asarray(student_ends, np.int64)
  t = np.asarray(teacher_ends, np.int64)
  common = np.union1d(np.intersect1d(s, t), [int(length)])
  return (np.searchsorted(common, s, "left"),
          np.minimum(np.searchsorted(common, t, "left"), len(common) - 1), len(common))


def char_ends(tokenizer, ids: Sequence[int], chunk: int = 64) -> tuple[str, list[int]]:
  """The text of `ids` (special tokens kept, no clean-up) and where each token ends in it, read by
  decoding prefixes: a token that decodes to part of a character (a byte-level piece of a
  multi-byte UTF-8 character, shown as U+FFFD until the rest arrives) ends where the token that
  completes the character ends. Not re-tokenizing the text: the sampled tokens need not be the
  tokenizer's own segmentation of their text.

  Prefixes are decoded within pieces of about `chunk` tokens (O(T x chunk), not O(T^2)): a piece
  counts only where its own decoding is the text's next characters (a piece that cuts a character,
  or whose first token decodes otherwise alone, grows to the next cut; one that reaches the end
  unmatched falls back to whole prefixes)."""
  ids = [int(i) for i in ids]
  kw = dict(skip_special_tokens=False, clean_up_tokenization_spaces=False)
  text = tokenizer.decode(ids, **kw)

  def local_ends(part: list[int], part_text: str) -> list[int]:
    prefixes = tokenizer.batch_decode([part[:k + 1] for k in range(len(part))], **kw)
    ends = [len(p) if part_text.startswith(p) else len(part_text) for p in prefixes]
    for k in range(len(ends) - 2, -1, -1):   # a partial character's token ends with the next one
      ends[k] = min(ends[k], ends[k + 1])
    return ends

  ends, pos, start = [], 0, 0
  while start < len(ids):
    stop = min(start + chunk, len(ids))
    piece = tokenizer.decode(ids[start:stop], **kw)
    while not (text.startswith(piece, pos) and (stop < len(ids) or pos + len(piece) == len(text))):
      if stop == len(ids):
        return text, local_ends(ids, text)
      stop = min(stop + chunk, len(ids))
      piece = tokenizer.decode(ids[start:stop], **kw)
    ends += [pos + e for e in local_ends(ids[start:stop], piece)]
    pos, start = pos + len(piece), stop
  return text, ends


class SpanAlignedTeacher:
  """A teacher with another tokenizer, scored on the student's samples through their text (the
  sampled-token estimator only; docs/distill.md says why and what it cannot do).

  Per row: the student's prompt tokens are decoded (chat markup included) and tokenized the
  teacher's way, the context the teacher conditions on. The completion is cut at the student's
  added/special tokens: each maps to the teacher's token of the same text (else, the student's EOS
  to the teacher's EOS), a span of its own; each run of ordinary tokens is decoded (`char_ends`),
  the text tokenized by the teacher with its offsets, and the two segmentations cut into common
  spans (`align_spans`). The teacher scores its tokens in one `logprobs` pass over the batch. For a
  span with student tokens S (logprob sum s) and teacher tokens (logprob sum t), each student token
  x gets the target log p(x) + (t - s) / |S|: the span's log-ratio split evenly over its tokens, so
  that the token gaps sum to the span's (and the completion's) log-ratio. A span where the teacher
  has no token (an unmapped special token, text its tokenizer drops) or holding a token outside the
  loss mask gets the student's own logprob as target (gap 0), counted in `unaligned_frac`. Where
  both tokenizers cut the text alike every span is one token on each side and the target is the
  teacher's logprob of that token."""

  def __init__(self, policy: Policy, tokenizer, student_tokenizer, pad_multiple: int = PAD_MULTIPLE):
    self.policy, self.tokenizer, self.student_tokenizer = policy, tokenizer, student_tokenizer
    self.pad_multiple = pad_multiple
    self.pad_id = next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None)
    vocab = tokenizer.get_vocab()
    self.special = {}   # the student's added/special token id -> the teacher's id, or None
    for sid in set(student_tokenizer.all_special_ids) | set(student_tokenizer.added_tokens_decoder):
      text = student_tokenizer.convert_ids_to_tokens(int(sid))
      if text in vocab:
        self.special[int(sid)] = vocab[text]
      elif sid == student_tokenizer.eos_token_id and tokenizer.eos_token_id is not None:
        self.special[int(sid)] = tokenizer.eos_token_id
      else:
        self.special[int(sid)] = None

  def align_row(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]):
    """(the teacher's prompt ids, its completion ids, each student completion token's span (-1:
    none), each teacher completion token's span, the number of spans)."""
    text = self.student_tokenizer.decode([int(i) for i in prompt_ids], skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False)
    teacher_prompt = list(self.tokenizer(text, add_special_tokens=True)["input_ids"]) or [self.pad_id]
    teacher_ids, s_span, t_span, spans = [], [], [], 0
    completion = [int(i) for i in completion_ids]
    i = 0
    while i < len(completion):
      if completion[i] in self.special:
        mapped = self.special[completion[i]]
        s_span.append(spans if mapped is not None else -1)
        if mapped is not None:
          teacher_ids.append(mapped)
          t_span.append(spans)
          spans += 1
        i += 1
        continue
      j = i
      while j < len(completion) and completion[j] not in self.special:
        j += 1
      run_text, ends = char_ends(self.student_tokenizer, completion[i:j])
      enc = self.tokenizer(run_text, add_special_tokens=False, return_offsets_mapping=True)
      t_ends = np.maximum.accumulate([e for _, e in enc["offset_mapping"]] or [0])[:len(enc["input_ids"])]
      s_idx, t_idx, n = align_spans(ends, t_ends, len(run_text))
      s_span.extend(int(k) + spans for k in s_idx)
      t_span.extend(int(k) + spans for k in t_idx)
      teacher_ids.extend(int(x) for x in enc["input_ids"])
      spans += n
      i = j
    return teacher_prompt, teacher_ids, np.asarray(s_span, np.int64), np.asarray(t_span, np.int64), spans

  def aligned_logprobs(self, batch: TrainBatch, student_lp: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """The targets [B, T] (float64) at the student's completion positions, given the student's own
    logprobs there (`student_lp`, [B, T]); metrics `unaligned_frac` (of the loss tokens) and
    `student_tokens_per_span` (of the aligned spans)."""
    m = np.asarray(batch.loss_mask, np.float64)
    student_lp = np.asarray(student_lp, np.float64)
    out = student_lp * m
    rows = []   # (row, completion start, its end, align_row's result)
    for b in range(batch.batch_size):
      length = int(np.asarray(batch.attention_mask[b]).sum())
      marked = np.flatnonzero(m[b, :length])
      if marked.size:
        start = int(marked[0])
        rows.append((b, start, length, self.align_row(batch.input_ids[b, :start], batch.input_ids[b, start:length])))
    if not rows:
      return out, {"unaligned_frac": 0.0, "student_tokens_per_span": 0.0}
    tbatch = pack_sequences([r[3][0] for r in rows], [r[3][1] for r in rows], self.pad_id, self.pad_multiple)
    tbatch.temperature = batch.temperature
    teacher_lp = np.asarray(self.policy.logprobs(tbatch), np.float64)
    unaligned, spans_used, tokens_used = 0.0, 0, 0
    for r, (b, start, end, (prompt, ids, s_span, t_span, n)) in enumerate(rows):
      s_lp, mask = student_lp[b, start:end], m[b, start:end]
      t_lp = teacher_lp[r, len(prompt):len(prompt) + len(ids)]
      has = s_span >= 0
      k = np.where(has, s_span, 0)
      s_sum = np.bincount(k[has], weights=s_lp[has], minlength=n)
      s_count = np.bincount(k[has], minlength=n)
      t_sum = np.bincount(t_span, weights=t_lp, minlength=n)
      t_count = np.bincount(t_span, minlength=n)
      masked_out = np.bincount(k[has], weights=(mask[has] == 0).astype(np.float64), minlength=n)
      ok_span = (s_count > 0) & (t_count > 0) & (masked_out == 0)
      ok = has & ok_span[k]
      share = (t_sum - s_sum) / np.maximum(s_count, 1)
      target = np.where(ok, s_lp + share[k], s_lp)
      out[b, start:end] = target * mask
      unaligned += float(((~ok) * mask).sum())
      spans_used += int(ok_span.sum())
      tokens_used += int(s_count[ok_span].sum())
    return out, {"unaligned_frac": unaligned / max(float(m.sum()), 1.0),
                 "student_tokens_per_span": tokens_used / max(spans_used, 1)}


LOSSES = ("topk_kl", "sampled_token")


def distill_update(teachers: Sequence, weights: Sequence[float], reward_weight: float,
                   loss: str = "topk_kl", top_k: int = 16, topk_loss=None, combine: str = "weighted") -> Update:
  """The GRPO loop's `Update` for on-policy distillation from `teachers` (frozen `Policy`s, or
  `SpanAlignedTeacher`s for another tokenizer: only their `logprobs` / `topk_logprobs` are called)
  combined per row by `combine` ('weighted': `weights`; 'select': one teacher per group,
  `teacher_row_weights`). `loss`: 'topk_kl' trains on `topk_loss` (the backend's `topk_kl_loss`,
  closed over `weights`, reading each row's weights from the batch) against the teachers' `top_k`
  (+ `reward_weight` x the loop's policy-gradient loss on the env reward's group advantages);
  'sampled_token' on the loop's policy-gradient loss with the per-token advantages of
  `token_advantages`."""
  if len(teachers) != len(weights) or not teachers:
    raise ValueError(f"{len(teachers)} teachers for {len(weights)} weights")
  if loss not in LOSSES:
    raise ValueError(f"grpo.distill.loss: must be one of {LOSSES}, got {loss!r}")
  if combine not in COMBINES:
    raise ValueError(f"grpo.distill.combine: must be one of {COMBINES}, got {combine!r}")
  if loss == "topk_kl" and topk_loss is None:
    raise ValueError("loss='topk_kl' needs topk_loss (the backend's top-k KL loss)")
  if loss == "topk_kl" and any(isinstance(t, SpanAlignedTeacher) for t in teachers):
    raise ValueError("grpo.distill.loss='topk_kl' compares the teachers' and the student's next-token "
                     "distributions token by token, which needs one vocabulary: a teacher with another "
                     "tokenizer takes loss='sampled_token'")

  def fn(policy: Policy, groups, settings, reference: Policy | None) -> dict[str, float]:
    common = dict(pad_id=settings.pad_id, kl_coef=settings.kl_coef, reference=reference,
                  num_minibatches=settings.num_minibatches, temperature=settings.sampling.temperature)
    sizes = [g.size for g in groups]
    if loss == "sampled_token":
      return train_on_groups(
          policy, groups, settings.update_loss, **common,
          extras_fn=lambda batch: token_advantages(batch, policy, teachers, weights, reward_weight,
                                                   combine, sizes))
    return train_on_groups(policy, groups, _with_reward(settings.update_loss), **common,
                           extras_fn=lambda batch: teacher_topk(batch, teachers, int(top_k), weights,
                                                                combine, sizes))

  made = {}

  def _with_reward(pg):
    """The top-k KL, + reward_weight x `pg` (the loop's loss on the groups' advantages) when that
    weight is > 0; made once per `pg`, since a JAX step compiles per loss callable."""
    if not reward_weight:
      return topk_loss
    if id(pg) not in made:
      def combined(logprobs, loss_mask, extras):
        kl, metrics = topk_loss(logprobs, loss_mask, extras)
        pg_loss, pg_metrics = pg(logprobs, loss_mask, extras)
        return kl + float(reward_weight) * pg_loss, {**pg_metrics, **metrics}
      made[id(pg)] = (pg, combined)
    return made[id(pg)][1]
  return Update(fn, name=f"distill_{loss}")

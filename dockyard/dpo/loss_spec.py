"""The DPO-family preference loss, written once in NumPy as the spec both trainers are tested against.

This file is the definition; `dockyard.trainer_jax.preference_loss` and
`dockyard.trainer_torch.preference_loss` must agree with it on any input. It depends on NumPy only,
so either backend imports it (for `PreferenceConfig` and `check_inputs`).

Batch layout (a `dockyard.policy.TrainBatch` read by a `LossFn`): pairs are interleaved, row 2i is
the CHOSEN completion y_w of pair i and row 2i+1 the REJECTED one y_l, so B is even and any split
of the batch at even rows keeps every pair whole (a trainer's micro_batch_size must be even). Per
token arrays are [B, T], entry t the prediction of token t; `loss_mask` is 1 on completion tokens.
A pair is real when both of its rows have loss tokens; a pair with an empty side (padding rows
the trainer appends, or a bad record) gets weight 0 in the loss and the metrics.

Per row, with m the loss mask and lp the policy's token logprobs (the only input with gradient):
  |y|   = sum_t m                     the completion length in tokens
  pi    = sum_t lp m                  sequence logprob (a SUM over tokens)
  pibar = pi / |y|                    per-token average logprob
  ref, refbar: the same for the frozen reference policy, from extras["reference_logprobs"]:
        either per token [B, T] (masked-summed here) or per sequence [B] (the sums over the loss
        tokens, e.g. cached once per data set). Needed by dpo and ipo only; never read otherwise.

Per pair, by `mode` (w = chosen, l = rejected; sigma the logistic function):
  dpo    h = beta [ (pi_w - ref_w) - (pi_l - ref_l) - lambda max(0, ref_w - pi_w) ]
               - alpha (|y_w| - |y_l|)
         l = -(1 - eps) log sigma(h) - eps log sigma(-h)
         DPO, Rafailov et al. 2023 (sums over tokens, as the paper and TRL's 'sigmoid' loss);
         cDPO / conservative DPO, eps = label_smoothing (Mitchell 2023; TRL label_smoothing);
         DPOP, Pal et al. 2024 ("Smaug", eq. 3): the penalty lambda = dpop_lambda sits INSIDE
         beta, as in the paper, on sequence SUMS (the paper's log pi(y_w|x)); it is zero while the
         policy's chosen logprob stays at or above the reference's;
         R-DPO, Park et al. 2024: alpha = length_alpha times the length difference in tokens,
         OUTSIDE beta, as in the paper.
  ipo    l = ( (pibar_w - refbar_w) - (pibar_l - refbar_l) - 1/(2 beta) )^2
         IPO, Azar et al. 2023, on per-token AVERAGE logprobs (as TRL's loss_type='ipo'), so the
         target margin 1/(2 beta) does not scale with the completion length.
  simpo  l = -log sigma( beta pibar_w - beta pibar_l - gamma )
         SimPO, Meng et al. 2024; gamma = simpo_gamma; reference-free.
  orpo   l = -log sigma( logodds_w - logodds_l ),  logodds = pibar - log(1 - exp(pibar))
         ORPO, Hong et al. 2024; reference-free. log(1 - e^a) is computed stably (log(-expm1 a)
         for a > -ln 2, log1p(-e^a) below) on a = min(pibar, -1e-6), so a completion the policy
         is certain of has a finite log odds.

The SFT term, per pair: nll = -pibar_w (the chosen completion's per-token mean NLL). It is added
as  loss_pair = l + sft_weight nll  (dpo, ipo, simpo; RPO, Pang et al. 2024, is dpo with
sft_weight > 0), and ORPO has it built in:  loss_pair = nll + orpo_lambda l  (sft_weight must be 0).

Aggregation: loss = sum over real pairs of loss_pair / N_pairs, N_pairs the WHOLE batch's pair
count so that micro-batch losses sum to the full-batch loss (`dockyard.policy.LossFn`):
extras["total_pairs"] when given; else extras["total_sequences"] / 2 (the trainers add
total_sequences, the rows with loss tokens, which is twice the pairs when no pair has an empty
side); else the real pairs in this batch. Metrics are sums over real pairs / N_pairs too, so they
add up across micro-batches:
  preference_loss   mean l;  sft_nll  mean nll
  rewards_chosen, rewards_rejected, reward_margin   mean r_w, r_l, r_w - r_l with the implicit
                    reward r of the mode: dpo beta (pi - ref); ipo beta (pibar - refbar);
                    simpo beta pibar; orpo logodds (the R-DPO and DPOP terms are not rewards)
  reward_accuracy   the fraction of pairs with r_w > r_l
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np


MODES = ("dpo", "ipo", "simpo", "orpo")
REFERENCE_MODES = ("dpo", "ipo")           # the modes that read extras["reference_logprobs"]
METRICS = ("loss", "preference_loss", "sft_nll", "rewards_chosen", "rewards_rejected",
           "reward_margin", "reward_accuracy")
LOG_PROB_CAP = -1e-6                       # ORPO: pibar is capped here before log(1 - e^pibar)


@dataclasses.dataclass(frozen=True)
class PreferenceConfig:
  """The options of the preference loss (see the module docstring for the formulas).

  A field that only one mode reads must stay 0 in the others: a cDPO smoothing given to IPO
  would otherwise be silently ignored."""
  mode: str = "dpo"                # dpo | ipo | simpo | orpo
  beta: float = 0.1                # dpo, ipo, simpo (unused by orpo)
  label_smoothing: float = 0.0     # cDPO eps, dpo only, in [0, 0.5)
  dpop_lambda: float = 0.0         # DPOP lambda, dpo only
  length_alpha: float = 0.0        # R-DPO alpha, dpo only
  sft_weight: float = 0.0          # + w * chosen NLL; dpo, ipo, simpo (orpo has its own)
  simpo_gamma: float = 0.0         # SimPO target margin, simpo only
  orpo_lambda: float = 0.0         # ORPO odds-ratio weight, orpo only and > 0 there

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"preference.mode must be one of {MODES}, got {self.mode!r}")
    for name in ("beta", "label_smoothing", "dpop_lambda", "length_alpha", "sft_weight",
                 "simpo_gamma", "orpo_lambda"):
      v = getattr(self, name)
      if not (isinstance(v, (int, float, np.floating, np.integer)) and np.isfinite(v) and v >= 0):
        raise ValueError(f"preference.{name} must be a finite number >= 0, got {v!r}")
    if self.mode != "orpo" and self.beta <= 0:
      raise ValueError(f"preference.beta must be > 0 for mode {self.mode!r}, got {self.beta}")
    if not self.label_smoothing < 0.5:
      raise ValueError(f"preference.label_smoothing (cDPO) must be < 0.5, got "
                       f"{self.label_smoothing}: at 0.5 the loss ignores the preference")
    only = dict(label_smoothing=("dpo", "cDPO smooths the DPO sigmoid loss"),
                dpop_lambda=("dpo", "DPOP penalizes the DPO margin against the reference"),
                length_alpha=("dpo", "R-DPO regularizes the DPO margin"),
                simpo_gamma=("simpo", "the SimPO target margin"),
                orpo_lambda=("orpo", "the ORPO odds-ratio weight"))
    for name, (mode, what) in only.items():
      if getattr(self, name) != 0 and self.mode != mode:
        raise ValueError(f"preference.{name}={getattr(self, name)} is {what}; it applies to "
                         f"mode={mode!r} only, not mode={self.mode!r} (set it to 0)")
    if self.mode == "orpo" and self.sft_weight != 0:
      raise ValueError(f"preference.sft_weight={self.sft_weight} with mode='orpo': ORPO's loss "
                       f"already is the chosen NLL + orpo_lambda * odds-ratio term; weight the "
                       f"odds-ratio term with orpo_lambda and leave sft_weight at 0")
    if self.mode == "orpo" and self.orpo_lambda <= 0:
      raise ValueError("preference.orpo_lambda must be > 0 with mode='orpo' (the paper uses "
                       "0.1); at 0 the loss is plain SFT on the chosen completions")

  @classmethod
  def from_config(cls, dpo) -> "PreferenceConfig":
    """From a config section holding the loss's options: `config.dpo` (configs/dpo.py, whose other
    keys, steps and pairs per step, are the offline loop's) or `config.grpo.preference` (online
    DPO in the GRPO loop, configs/online_dpo.py)."""
    return cls(mode=str(dpo.mode), beta=float(dpo.beta), label_smoothing=float(dpo.label_smoothing),
               dpop_lambda=float(dpo.dpop_lambda), length_alpha=float(dpo.length_alpha),
               sft_weight=float(dpo.sft_weight), simpo_gamma=float(dpo.simpo_gamma),
               orpo_lambda=float(dpo.orpo_lambda))

  @property
  def needs_reference(self) -> bool:
    return self.mode in REFERENCE_MODES


def check_inputs(logprobs_shape, extras: Mapping[str, Any], cfg: PreferenceConfig) -> None:
  """Names what is wrong (odd batch, missing reference) instead of failing inside a trace."""
  if len(logprobs_shape) != 2 or logprobs_shape[0] % 2:
    raise ValueError(f"preference loss: logprobs must be [B, T] with B even (rows 2i, 2i+1 are "
                     f"the chosen and rejected completions of pair i), got shape "
                     f"{tuple(logprobs_shape)}; micro-batches must split at even rows")
  if cfg.needs_reference and "reference_logprobs" not in extras:
    raise KeyError(f"preference loss mode={cfg.mode!r}: batch.extras lacks ['reference_logprobs'] "
                   f"(has {sorted(extras)})")


def _log1mexp(a: np.ndarray) -> np.ndarray:
  """log(1 - e^a) for a < 0, accurate at both ends (Maechler 2012)."""
  return np.where(a > -np.log(2.0), np.log(-np.expm1(a)), np.log1p(-np.exp(a)))


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
  return -np.logaddexp(0.0, -x)


def preference_loss(logprobs: np.ndarray, loss_mask: np.ndarray, extras: Mapping[str, np.ndarray],
                    cfg: PreferenceConfig) -> tuple[float, dict[str, float]]:
  """The reference loss: (scalar loss, summable metrics). See the module docstring."""
  check_inputs(np.shape(logprobs), extras, cfg)
  lp = np.asarray(logprobs, np.float64)
  m = np.asarray(loss_mask, np.float64)
  n = m.sum(-1)                                        # |y| per row
  s = (lp * m).sum(-1)                                 # pi per row
  avg = s / np.maximum(n, 1.0)                         # pibar per row
  n_w, n_l, s_w, s_l, avg_w, avg_l = n[0::2], n[1::2], s[0::2], s[1::2], avg[0::2], avg[1::2]
  real = ((n_w > 0) & (n_l > 0)).astype(np.float64)
  if "total_pairs" in extras:
    total_pairs = float(extras["total_pairs"])
  elif "total_sequences" in extras:
    total_pairs = float(extras["total_sequences"]) / 2.0
  else:
    total_pairs = float(real.sum())
  total_pairs = max(total_pairs, 1.0)

  if cfg.needs_reference:
    ref = np.asarray(extras["reference_logprobs"], np.float64)
    ref_s = (ref * m).sum(-1) if ref.ndim == 2 else ref
    ref_w, ref_l = ref_s[0::2], ref_s[1::2]

  if cfg.mode == "dpo":
    h = cfg.beta * ((s_w - ref_w) - (s_l - ref_l) - cfg.dpop_lambda * np.maximum(0.0, ref_w - s_w))
    h = h - cfg.length_alpha * (n_w - n_l)
    eps = cfg.label_smoothing
    pref = -(1.0 - eps) * _log_sigmoid(h) - eps * _log_sigmoid(-h)
    r_w, r_l = cfg.beta * (s_w - ref_w), cfg.beta * (s_l - ref_l)
  elif cfg.mode == "ipo":
    ref_avg_w, ref_avg_l = ref_w / np.maximum(n_w, 1.0), ref_l / np.maximum(n_l, 1.0)
    pref = ((avg_w - ref_avg_w) - (avg_l - ref_avg_l) - 1.0 / (2.0 * cfg.beta)) ** 2
    r_w, r_l = cfg.beta * (avg_w - ref_avg_w), cfg.beta * (avg_l - ref_avg_l)
  elif cfg.mode == "simpo":
    pref = -_log_sigmoid(cfg.beta * avg_w - cfg.beta * avg_l - cfg.simpo_gamma)
    r_w, r_l = cfg.beta * avg_w, cfg.beta * avg_l
  else:  # orpo
    a_w, a_l = np.minimum(avg_w, LOG_PROB_CAP), np.minimum(avg_l, LOG_PROB_CAP)
    r_w, r_l = a_w - _log1mexp(a_w), a_l - _log1mexp(a_l)
    pref = -_log_sigmoid(r_w - r_l)

  nll = -avg_w
  if cfg.mode == "orpo":
    per_pair = nll + cfg.orpo_lambda * pref
  else:
    per_pair = pref + cfg.sft_weight * nll

  def mean(x):
    return float((x * real).sum() / total_pairs)

  loss = mean(per_pair)
  metrics = dict(
      loss=loss, preference_loss=mean(pref), sft_nll=mean(nll), rewards_chosen=mean(r_w),
      rewards_rejected=mean(r_l), reward_margin=mean(r_w - r_l),
      reward_accuracy=mean((r_w > r_l).astype(np.float64)))
  return loss, metrics


def random_pairs(rng: np.random.Generator, pairs: int = 4, t: int = 10, empty_pair: bool = True,
                 reference: bool = True):
  """Random inputs for checking an implementation against this spec: (logprobs [2P, T], mask,
  extras) with ragged masks (prompt zeros on the left, padding on the right), chosen and rejected
  of unequal lengths, and, with `empty_pair`, a last pair whose rows have no loss tokens (the
  trainer's padding rows)."""
  b = 2 * pairs
  mask = np.zeros((b, t), np.float32)
  real_rows = b - 2 if empty_pair else b
  for i in range(real_rows):
    start = rng.integers(1, 4)
    mask[i, start:rng.integers(start + 1, t + 1)] = 1
  lp = -rng.uniform(0.05, 2.5, (b, t)).astype(np.float32)
  extras = {}
  if reference:
    extras["reference_logprobs"] = (lp + rng.normal(scale=0.4, size=(b, t))).astype(np.float32)
  return lp, mask, extras

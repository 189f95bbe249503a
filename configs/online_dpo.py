r"""Online DPO: the GRPO loop, its update replaced by a DPO-family step on each prompt's best vs worst
sampled completion (dockyard/dpo/online.py).

configs/math.py with `grpo.objective="dpo"` and a `grpo.preference` section (the DPO family's loss
options, as configs/dpo.py's `dpo` section without its offline loop keys): every step samples
`grpo.num_generations_per_prompt` completions per prompt with the vLLM engines, the math verifier
scores them, each group with distinct rewards gives one (best, worst) pair, and one preference step
trains on the pairs against the frozen reference (the policy after the SFT warm start); then refit,
validation and checkpoints as in GRPO. The embedded default (variant `tiny`) is configs/math.py's
tiny run (the 85-step SFT warm start, 800 steps of 16 prompts x 8 samples on single-digit sums):

  python -m dockyard.launch --config=configs/online_dpo.py --workdir=workdirs/online_dpo

SmolLM2-135M-Instruct on two-digit + and - (configs/math.py:smollm's task and sampling):

  python -m dockyard.launch --config=configs/online_dpo.py:smollm --workdir=workdirs/online_dpo_smollm

`:mode=` picks the loss (dpo | ipo | simpo | orpo) with configs/dpo.py's settings for it; `torch`
and `sync` as in configs/math.py. The KL term of the policy-gradient loss is off
(`loss_fn.reference_policy_kl_penalty=0`): the preference loss's `beta` ties the policy to the
reference. Not yet measured on held-out data: docs/dpo.md.
"""
from configs import dpo as dpo_config
from configs import math as math_config
from dockyard import config_lib

MATH_ARGS = ("tiny", "full", "torch", "sync", "runlocal", "smollm")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, tiny=False, full=False, torch=False, sync=False, runlocal=False,
                             smollm=False, mode="dpo")
  if arg.mode not in dpo_config.MODES:
    raise ValueError(f"Config argument 'mode' must be one of {sorted(dpo_config.MODES)}, got {arg.mode!r}")
  config = math_config.get_config(",".join(k for k in MATH_ARGS if arg[k]))
  config.run.name = config.run.name.replace("math", f"online_{arg.mode}")

  # grpo: the same loop and sampling; the update is the preference step on best-vs-worst pairs.
  config.grpo.objective = "dpo"
  config.grpo.preference = dict(
      mode=arg.mode,           # dpo | ipo | simpo | orpo
      beta=0.1,                # dpo, ipo, simpo: the strength of the tie to the reference
      label_smoothing=0.0,     # cDPO eps (dpo only), in [0, 0.5)
      dpop_lambda=0.0,         # DPOP penalty (dpo only)
      length_alpha=0.0,        # R-DPO length regularizer (dpo only)
      sft_weight=0.0,          # + weight x the chosen completions' NLL (dpo, ipo, simpo)
      simpo_gamma=0.0,         # SimPO target margin (simpo only)
      orpo_lambda=0.0,         # ORPO odds-ratio weight (orpo only, > 0 there)
  )
  # configs/dpo.py's per-mode settings, except its SFT blend (set for pairs of gold answers there;
  # here the chosen completion is only the better of the samples, right or not).
  config.grpo.preference.update({k: v for k, v in dpo_config.MODES[arg.mode].items() if k != "sft_weight"})
  # loss_fn: the policy-gradient loss's KL term is off (beta above is the tie to the reference).
  config.loss_fn.reference_policy_kl_penalty = 0.0
  if arg.smollm:
    # configs/math.py:smollm's sampling, rate and batch (32 questions x 8 samples); 20 steps, not its
    # 40: a step is ~45 s here (generate ~21 s, the reference and preference step ~15 s), so one
    # run with held-out pass@1 at 0, 10 and 20 fits ~17 min (set from a 3-step timing, before any run).
    config.grpo.max_num_steps = 20
  return config


def get_hyper(h, arg=None):
  """The sweep: beta (half and double the mode's) x the rate (half and double the variant's)."""
  config = get_config(arg)
  lr, beta = config.optim.lr, config.grpo.preference.beta
  return h.product([h.sweep("config.grpo.preference.beta", [beta / 2, beta * 2]),
                    h.sweep("config.optim.lr", [lr / 2, lr * 2])])

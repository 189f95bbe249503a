"""Config validation that runs before anything heavy loads (no model, no Ray, no vLLM).

`check_overrides` catches unknown `--config.*` keys and wrong types with a message that names
the key (absl alone reports a bare AttributeError); `validate` checks the cross-field rules.
Every failure is a `ConfigError` whose message starts with the offending key.
"""
from __future__ import annotations

import difflib
import importlib.util
import math
import os
import sys
from typing import Any, Sequence

import ml_collections


class ConfigError(ValueError):
  """A config that cannot run; `key` is the dotted path of the culprit."""

  def __init__(self, key: str, message: str):
    super().__init__(f"config.{key}: {message}")
    self.key = key


def load_config_module(path: str):
  """Imports a config file as a module (its repo root on sys.path, so `from configs import swe` works)."""
  if not os.path.exists(path):
    raise ConfigError("(file)", f"config file {path!r} does not exist")
  module_spec = importlib.util.spec_from_file_location("_dockyard_config", path)
  module = importlib.util.module_from_spec(module_spec)
  root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
  if root not in sys.path:
    sys.path.insert(0, root)
  module_spec.loader.exec_module(module)
  return module


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """Loads `path.py[:arg]` the way `config_flags` does (without absl flags)."""
  path, _, arg = spec.partition(":")
  return load_config_module(path).get_config(arg or None)


def _lookup(config: ml_collections.ConfigDict, key: str) -> Any:
  node: Any = config
  walked = []
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      options = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
      close = difflib.get_close_matches(part, options, n=1)
      where = ".".join(walked) or "config"
      hint = f"; did you mean {'.'.join(walked + close)!r}?" if close else ""
      raise ConfigError(key, f"unknown key ({where} has: {', '.join(sorted(options))}){hint}")
    node = node[part]
    walked.append(part)
  return node


# Keys that were replaced: an override of one names what to set instead.
REMOVED_KEYS = {
    "loss_fn.aggregation": "replaced by loss_fn.ratio_level (token | sequence); the old "
                           "'sequence' also normalized per sequence: set loss_fn.normalization=sequence",
    "loss_fn.length_normalization": "replaced by loss_fn.normalization: the old 'token_mean' is "
                                    "'token' (or 'sequence' under sequence-level ratios), 'dr_grpo' "
                                    "is 'constant'",
}


def check_overrides(config: ml_collections.ConfigDict, argv: Sequence[str]) -> None:
  """Checks every `--config.a.b=v` in argv names an existing key and parses to its type."""
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    key, sep, value = arg[len("--config."):].partition("=")
    if key in REMOVED_KEYS:
      raise ConfigError(key, REMOVED_KEYS[key])
    current = _lookup(config, key)
    if not sep or current is None or isinstance(current, ml_collections.ConfigDict):
      continue
    kind = type(current)
    try:
      if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
          raise ValueError
      elif kind in (int, float):
        kind(value)
    except ValueError:
      raise ConfigError(key, f"expected {kind.__name__}, got {value!r}") from None


def _mesh_devices(config) -> int:
  cluster = config.cluster
  if cluster.accelerators_per_node > 0:
    return cluster.trainer_nodes * cluster.accelerators_per_node
  return cluster.cpu_devices


def resolve_mesh_shape(shape: Sequence[int], num_devices: int, key: str = "mesh.shape") -> tuple[int, ...]:
  """Fills one -1 in `shape` with the rest of `num_devices`; errors name `key`."""
  shape = tuple(int(s) for s in shape)
  if shape.count(-1) > 1:
    raise ConfigError(key, f"at most one -1 allowed, got {shape}")
  if any(s == 0 or s < -1 for s in shape):
    raise ConfigError(key, f"entries must be positive or -1, got {shape}")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ConfigError(key, f"{shape} cannot fill {num_devices} devices ({num_devices} % {known} != 0)")
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if math.prod(shape) != num_devices:
    raise ConfigError(key, f"{shape} multiplies to {math.prod(shape)}, but the trainer has "
                      f"{num_devices} devices")
  return shape


def _check_canary(canary) -> None:
  """refit.canary's bounds (dockyard/refit/canary.py)."""
  if canary.enabled and not canary.max_abs_logprob_delta > 0:
    raise ConfigError("refit.canary.max_abs_logprob_delta", f"must be > 0, got {canary.max_abs_logprob_delta}")
  if not canary.max_mean_abs_logprob_delta >= 0:
    raise ConfigError("refit.canary.max_mean_abs_logprob_delta",
                      f"must be >= 0 (0: the max bound alone), got {canary.max_mean_abs_logprob_delta}")


def validate(config: ml_collections.ConfigDict) -> None:
  """Cross-field rules; raises ConfigError naming the first key that breaks one."""
  if "dpo" in config:   # a preference run (configs/dpo.py): no grpo, rollout or sandbox sections
    _validate_preference(config)
    return
  if "sft" in config:   # supervised fine-tuning (configs/sft.py): no grpo or sandbox sections
    _validate_sft(config)
    return
  if "rm" in config:    # a reward model (configs/rm.py): no grpo, rollout or sandbox sections
    _validate_reward_model(config)
    return
  grpo = config.grpo
  if config.run.mode not in ("train", "eval"):
    raise ConfigError("run.mode", f"must be 'train' or 'eval', got {config.run.mode!r}")
  _validate_policy(config)
  if grpo.num_generations_per_prompt < 2:
    raise ConfigError("grpo.num_generations_per_prompt",
                      f"GRPO needs a group of at least 2 samples per prompt, "
                      f"got {grpo.num_generations_per_prompt}")
  if grpo.num_prompts_per_step < 1:
    raise ConfigError("grpo.num_prompts_per_step", f"must be >= 1, got {grpo.num_prompts_per_step}")
  if grpo.num_minibatches < 1:
    raise ConfigError("grpo.num_minibatches",
                      f"must be >= 1 (optimizer steps per batch), got {grpo.num_minibatches}")
  if "agent" in config:
    from dockyard.agent.episode import AgentConfig
    try:
      AgentConfig.from_config(config.agent)
    except (TypeError, ValueError) as e:
      raise ConfigError("agent", str(e)) from None
    if config.agent.get("max_context_tokens", 4096) > config.rollout.max_model_len:
      raise ConfigError("agent.max_context_tokens", f"an episode's trajectory goes to the engine whole: "
                        f"must be <= rollout.max_model_len ({config.rollout.max_model_len})")
  if grpo.advantage.estimator not in ("grpo", "gdpo", "reinforce++"):
    raise ConfigError("grpo.advantage.estimator", f"unknown estimator {grpo.advantage.estimator!r}")
  _validate_objective(config)
  if grpo.async_grpo.enabled:
    if not config.loss_fn.use_importance_sampling_correction:
      raise ConfigError("loss_fn.use_importance_sampling_correction",
                        "async GRPO (grpo.async_grpo.enabled=True) trains on trajectories from older "
                        "weights and requires importance-sampling correction; set it to True")
    if grpo.async_grpo.max_trajectory_age_steps < 1:
      raise ConfigError("grpo.async_grpo.max_trajectory_age_steps",
                        f"must be >= 1 for async GRPO, got {grpo.async_grpo.max_trajectory_age_steps}")
    if grpo.async_grpo.in_flight_policy not in ("finish", "abort"):
      raise ConfigError("grpo.async_grpo.in_flight_policy",
                        f"must be 'finish' or 'abort', got {grpo.async_grpo.in_flight_policy!r}")
    if grpo.async_grpo.on_timeout not in ("drop", "retry"):
      raise ConfigError("grpo.async_grpo.on_timeout",
                        f"must be 'drop' or 'retry', got {grpo.async_grpo.on_timeout!r}")
  loss = config.loss_fn
  if loss.ratio_level not in ("token", "sequence"):
    raise ConfigError("loss_fn.ratio_level", f"must be 'token' or 'sequence', got {loss.ratio_level!r}")
  if loss.normalization not in ("token", "sequence", "constant"):
    raise ConfigError("loss_fn.normalization",
                      f"must be 'token', 'sequence' or 'constant' (Dr. GRPO), got {loss.normalization!r}")
  if loss.ratio_clip_min < 0 or loss.ratio_clip_max < 0:
    raise ConfigError("loss_fn.ratio_clip_min", "clip epsilons must be >= 0")
  _validate_mesh(config)
  _validate_packing(config)
  cluster = config.cluster
  if (cluster.accelerators_per_node > 0 and not cluster.colocated
      and cluster.trainer_nodes + cluster.inference_nodes > cluster.num_nodes):
    raise ConfigError("cluster.trainer_nodes", f"trainer_nodes ({cluster.trainer_nodes}) + inference_nodes "
                      f"({cluster.inference_nodes}) exceed num_nodes ({cluster.num_nodes})")
  rollout = config.rollout
  if rollout.num_engines < 1:
    raise ConfigError("rollout.num_engines", f"must be >= 1, got {rollout.num_engines}")
  if cluster.accelerators_per_node > 0:
    gpus = cluster.inference_nodes * cluster.accelerators_per_node
    if rollout.num_engines * rollout.tensor_parallel_size > gpus:
      raise ConfigError("rollout.num_engines", f"{rollout.num_engines} engines x tensor_parallel_size "
                        f"{rollout.tensor_parallel_size} need more than the {gpus} inference accelerators")
  if config.run.mode == "train":
    # The trainer scores softmax(logits / T) (dockyard.policy.TrainBatch.temperature); it does not
    # reproduce vLLM's top-p truncation, so a top-p sample's logprobs would not match.
    if not rollout.temperature > 0:
      raise ConfigError("rollout.temperature", f"GRPO training samples groups and trains their "
                        f"distribution softmax(logits / T): must be > 0, got {rollout.temperature} (greedy "
                        f"decoding is for validation: rollout.val_temperature)")
    if rollout.top_p != 1.0:
      raise ConfigError("rollout.top_p", f"must be 1.0 in training, got {rollout.top_p}: the trainer "
                        f"scores the full softmax(logits / T), not a top-p truncated one, so the "
                        f"importance weight and the trained distribution would be wrong")
  if rollout.max_new_tokens >= rollout.max_model_len:
    raise ConfigError("rollout.max_new_tokens", f"must be < rollout.max_model_len ({rollout.max_model_len})")
  if config.refit.transport not in ("auto", "inprocess", "object_store", "shared_memory", "nccl"):
    raise ConfigError("refit.transport", f"unknown transport {config.refit.transport!r}")
  _check_canary(config.refit.canary)
  lora_mode = config.refit.get("lora_mode", "merge")
  if lora_mode not in ("merge", "adapter"):
    raise ConfigError("refit.lora_mode", f"must be 'merge' or 'adapter', got {lora_mode!r}")
  if lora_mode == "adapter":
    if not config.policy.lora.enabled:
      raise ConfigError("refit.lora_mode", "'adapter' ships LoRA adapters to vLLM: it needs "
                        "policy.lora.enabled=True (without LoRA every refit is a full one)")
    if config.policy.lora.get("base_quant", "none") != "none":
      raise ConfigError("refit.lora_mode", f"'adapter' has vLLM serve the adapters on the HF "
                        f"checkpoint's own base, but the trainer computes with a quantized one "
                        f"(policy.lora.base_quant={config.policy.lora.base_quant!r}): the two would "
                        f"differ by the quantization error; use lora_mode='merge' (it sends the "
                        f"dequantized W + scale * B A the trainer uses)")
    if config.refit.transport == "nccl":
      raise ConfigError("refit.lora_mode", "'adapter' ships a PEFT adapter directory (through the "
                        "object store to a fleet), not weights over a broadcast: refit.transport='nccl' "
                        "would go unused; use 'auto' or lora_mode='merge'")
  if config.env.name not in ("swe", "math", "terminal", "choice"):
    raise ConfigError("env.name", f"must be 'swe', 'math', 'terminal' or 'choice', got {config.env.name!r}")
  if config.env.name == "choice":
    from dockyard.envs import choice as choice_env   # no model, no engine
    if "choice" not in config.env:
      raise ConfigError("env.choice", "env.name='choice' needs an env.choice section (configs/eval.py:set=choice)")
    try:
      choice_env.ChoiceConfig.from_config(config)
    except ValueError as err:
      raise ConfigError("env.choice", str(err).removeprefix("env.choice.")) from None
  if config.env.name == "terminal":
    _validate_terminal(config)
  if config.env.name == "math":
    from dockyard.envs import math as math_env   # NumPy only: no model, no engine
    try:
      math_env.MathConfig.from_config(config)
    except ValueError as err:
      raise ConfigError("env.math", str(err).removeprefix("env.math.")) from None
  _validate_data_plane(config)
  if "reward_model" in config.env and config.env.reward_model.path:
    path = config.env.reward_model.path
    if not os.path.exists(os.path.join(path, "config.json")):
      raise ConfigError("env.reward_model.path", f"no reward model at {path!r} (a directory that "
                        f"configs/rm.py saved: <workdir>/reward_model)")
    if int(config.env.reward_model.batch_size) < 1:
      raise ConfigError("env.reward_model.batch_size", f"must be >= 1, got {config.env.reward_model.batch_size}")
  if config.env.name == "swe" and config.env.code.reward not in ("resolved", "pass_rate"):
    raise ConfigError("env.code.reward", f"must be 'resolved' or 'pass_rate', got {config.env.code.reward!r}")
  eval_cfg = config.eval
  if eval_cfg.pass_k < 0:
    raise ConfigError("eval.pass_k", f"must be >= 0 (0: greedy pass@1 only), got {eval_cfg.pass_k}")
  if eval_cfg.pass_k > 0:
    if eval_cfg.num_samples < eval_cfg.pass_k:
      raise ConfigError("eval.num_samples", f"pass@{eval_cfg.pass_k} needs at least {eval_cfg.pass_k} "
                        f"samples per task, got {eval_cfg.num_samples}")
    if eval_cfg.temperature <= 0:
      raise ConfigError("eval.temperature", f"pass@k samples need a temperature > 0 (greedy samples "
                        f"are all the same), got {eval_cfg.temperature}")
    if eval_cfg.bootstrap_resamples < 1:
      raise ConfigError("eval.bootstrap_resamples", f"must be >= 1, got {eval_cfg.bootstrap_resamples}")
  if config.checkpoint.metric_mode not in ("max", "min"):
    raise ConfigError("checkpoint.metric_mode", f"must be 'max' or 'min', got {config.checkpoint.metric_mode!r}")
  if config.checkpoint.keep_top_k < 1:
    raise ConfigError("checkpoint.keep_top_k", f"must be >= 1, got {config.checkpoint.keep_top_k}")


def _validate_data_plane(config) -> None:
  plane = config.rollout.get("data_plane")
  if plane is None:
    return
  if plane != "object_store":
    raise ConfigError("rollout.data_plane", f"must be None (colocated) or 'object_store', got {plane!r}")
  if "agent" in config:
    raise ConfigError("rollout.data_plane", "agent episodes keep their session on one executor and are "
                      "played from the driver; the data plane carries single-shot groups only: set it to None")
  if "reward_model" in config.env and config.env.reward_model.path:
    raise ConfigError("rollout.data_plane", "with env.reward_model.path each experience worker would load "
                      "the reward model; set one of them to None / ''")


def _validate_policy(config) -> None:
  """policy.*: what both the GRPO and the preference runs build their trainer from."""
  if int(config.policy.seq_bucket) < 1:
    raise ConfigError("policy.seq_bucket", f"must be >= 1, got {config.policy.seq_bucket}")
  _validate_backend_and_model(config)
  from dockyard.models.lora import LoRAConfig   # stdlib + NumPy: nothing heavy loads here
  try:
    lora = LoRAConfig.from_config(config)
  except ValueError as err:   # "policy.lora.<key>: ..." -> the key it names
    key, _, message = str(err).partition(": ")
    raise ConfigError(key, message) from None
  if lora is not None and lora.base_quant != "none" and config.policy.backend != "jax":
    raise ConfigError("policy.lora.base_quant", f"{lora.base_quant!r} (a quantized base, QLoRA) is "
                      f"the JAX trainer's; the torch backend's would be bitsandbytes, which has no "
                      f"CPU path: set policy.backend='jax' or base_quant='none'")


def _validate_backend_and_model(config) -> None:
  """policy.backend, and a `package:` model that its package must ship (checked without loading)."""
  if config.policy.backend not in ("jax", "torch"):
    raise ConfigError("policy.backend", f"must be 'jax' or 'torch', got {config.policy.backend!r}")
  specs = [("policy.model_name_or_path", str(config.policy.model_name_or_path))]
  if not config.policy.model_name_or_path and "tiny" in config.policy:   # the tiny model made locally
    specs.append(("policy.tiny.tokenizer_from", str(config.policy.tiny.get("tokenizer_from", ""))))
  for key, spec in specs:
    if spec.startswith("package:"):
      _check_package(key, spec)


def _check_package(key: str, spec: str) -> None:
  """A `package:<name>` model its package must ship (checked without loading), named by `key`."""
  from dockyard.models import packaged  # stdlib only: nothing heavy loads here
  try:
    packaged.check(spec)
  except packaged.PackagedModelError as e:
    raise ConfigError(key, str(e)) from None


def _validate_packing(config, preference: bool = False) -> None:
  """policy.packing_row_tokens / optim.micro_batch_tokens (dockyard/packing.py): the combinations
  that cannot work, each named by its keys."""
  row = int(config.policy.get("packing_row_tokens", 0))
  budget = int(config.optim.get("micro_batch_tokens", 0))
  for key, value in (("policy.packing_row_tokens", row), ("optim.micro_batch_tokens", budget)):
    if value < 0:
      raise ConfigError(key, f"must be >= 0 (0: off), got {value}")
  if row and budget:
    raise ConfigError("optim.micro_batch_tokens", f"set together with policy.packing_row_tokens={row}: "
                      f"packed micro-batches are already budgeted in tokens (optim.micro_batch_size "
                      f"rows x policy.packing_row_tokens); set one of the two")
  if preference and (row or budget):
    key = "policy.packing_row_tokens" if row else "optim.micro_batch_tokens"
    raise ConfigError(key, "a preference loss pairs rows 2i and 2i+1 inside one micro-batch; packing "
                      "and token-budget micro-batches regroup sequences by length and would split "
                      "pairs: leave it 0 for preference losses (configs/dpo.py, online DPO)")
  if not preference:
    # A row (or a micro-batch) must hold a whole sequence: a prompt plus up to max_new_tokens.
    need = int(config.rollout.max_new_tokens) + 1
    for key, value in (("policy.packing_row_tokens", row), ("optim.micro_batch_tokens", budget)):
      if value and value < need:
        raise ConfigError(key, f"{value} cannot hold one sequence: a prompt plus up to "
                          f"rollout.max_new_tokens={need - 1} completion tokens needs more")


def _validate_mesh(config) -> None:
  if len(config.mesh.shape) != len(config.mesh.axes):
    raise ConfigError("mesh.shape", f"{tuple(config.mesh.shape)} has {len(config.mesh.shape)} entries "
                      f"but mesh.axes has {len(config.mesh.axes)}")
  shape = resolve_mesh_shape(config.mesh.shape, _mesh_devices(config))
  _validate_sequence_axis(config, dict(zip(config.mesh.axes, shape)).get("sequence", 1))
  _validate_family(config)


def _validate_sequence_axis(config, size: int) -> None:
  """A 'sequence' mesh axis (context parallelism, dockyard/trainer_jax/context_parallel.py) splits
  each row's tokens: it must divide every padded row length, and no logical rule may use it."""
  if size <= 1:
    return
  if config.policy.backend != "jax":
    raise ConfigError("mesh.shape", f"a 'sequence' mesh axis of size {size} (context parallelism) is "
                      f"JAX-only; policy.backend={config.policy.backend!r} has none: set it to 1")
  for key in ("policy.seq_bucket", "policy.packing_row_tokens"):
    section, name = key.split(".")
    length = int(config[section].get(name, 0))
    if length % size:
      raise ConfigError(key, f"{length} is not a multiple of the 'sequence' mesh axis ({size}): "
                        f"rows pad to multiples of it and each device takes an equal block of tokens")
  for name, target in config.mesh.rules:
    if "sequence" in ((target,) if isinstance(target, str) else tuple(target or ())):
      raise ConfigError("mesh.rules", f"{name!r} maps to the 'sequence' mesh axis, which splits tokens "
                        f"only (the policy places them; no logical rule may use it)")


def _model_family(config) -> tuple[str, int] | None:
  """(model_type, num_experts) of the policy model, from `policy.tiny` or a local config.json;
  None when the model is not on this machine yet (a hub name, a package)."""
  path = str(config.policy.model_name_or_path)
  if not path:
    from dockyard.models import tiny   # stdlib at import: transformers loads only to build a model
    family = config.policy.tiny.family
    if family not in tiny.FAMILIES:
      raise ConfigError("policy.tiny.family", f"unknown family {family!r}; known: {sorted(tiny.FAMILIES)}")
    if family == "qwen3_next":
      return family, int(config.policy.tiny.get("num_experts", tiny.QWEN3_NEXT_DEFAULTS["num_experts"]))
    return family, int(config.policy.tiny.get("num_experts", tiny.MOE_DEFAULTS["num_experts"])) \
        if family == "qwen3_moe" else 0
  if not os.path.isfile(os.path.join(path, "config.json")):
    return None
  from dockyard.models.model_config import ModelConfig   # NumPy + json: no framework loads
  try:
    c = ModelConfig.from_pretrained(path)
  except (ValueError, KeyError) as e:
    raise ConfigError("policy.model_name_or_path", f"{path}: {e}") from None
  return c.family, c.num_experts


def _validate_qwen3_next(config, sequence_axis: int) -> None:
  """What Qwen3-Next's Gated DeltaNet layers cannot do yet (docs/qwen3_next.md): their recurrence
  (and causal conv) runs over a whole row, so it can neither be split over a 'sequence' axis nor
  restart at packed segments' boundaries; and LoRA walks q/k/v/o projections that these layers
  do not have."""
  if sequence_axis > 1:
    raise ConfigError("mesh.shape", f"a 'sequence' mesh axis of size {sequence_axis}: context parallelism "
                      f"is not implemented for qwen3_next's Gated DeltaNet layers (their recurrence runs "
                      f"over the whole row); set that axis to 1")
  if int(config.policy.get("packing_row_tokens", 0)):
    raise ConfigError("policy.packing_row_tokens", f"{config.policy.packing_row_tokens}: qwen3_next's Gated "
                      f"DeltaNet layers would carry their recurrent state and conv window across packed "
                      f"segments (no reset at segment starts, in dockyard or in transformers' torch path); "
                      f"set it to 0")
  if "lora" in config.policy and config.policy.lora.get("enabled"):
    raise ConfigError("policy.lora.enabled", "LoRA is not implemented for qwen3_next (its Gated DeltaNet "
                      "layers have no q/k/v/o projections; adapters on in_proj_qkvz / out_proj are not "
                      "written); set it to False")


def _validate_family(config) -> None:
  """What a model family can use: an expert mesh axis and router options need experts (and must
  split them evenly); the torch trainer trains MoE models without expert parallelism or the
  balancing bias."""
  found = _model_family(config)
  shape = resolve_mesh_shape(config.mesh.shape, _mesh_devices(config))
  expert_axis = dict(zip(config.mesh.axes, shape)).get("expert", 1)
  moe = config.policy.get("moe") or {}
  for key in ("aux_loss_coef", "z_loss_coef", "bias_update_rate"):
    if float(moe.get(key, 0.0)) < 0:
      raise ConfigError(f"policy.moe.{key}", f"must be >= 0, got {moe[key]}")
  if found is None:
    return
  family, experts = found
  if family == "qwen3_next":
    _validate_qwen3_next(config, dict(zip(config.mesh.axes, shape)).get("sequence", 1))
  if not experts:
    if expert_axis > 1:
      raise ConfigError("mesh.shape", f"an 'expert' mesh axis of size {expert_axis}, but {family!r} is a "
                        f"dense model (no experts to split): set that axis to 1")
    for key in ("aux_loss_coef", "z_loss_coef", "bias_update_rate"):
      if float(moe.get(key, 0.0)):
        raise ConfigError(f"policy.moe.{key}", f"{moe[key]} on {family!r}, a dense model (no router)")
    return
  if config.policy.backend == "torch":
    # transformers' router (what the torch trainer runs) picks experts from its probabilities alone.
    if float(moe.get("bias_update_rate", 0.0)):
      raise ConfigError("policy.moe.bias_update_rate", f"{moe['bias_update_rate']}: aux-loss-free balancing "
                        f"(a per-expert routing bias) is JAX-only: transformers' {family!r} router has no "
                        f"bias; set it to 0 on policy.backend='torch'")
    if expert_axis > 1:
      raise ConfigError("mesh.shape", f"an 'expert' mesh axis of size {expert_axis}: the torch trainer has "
                        f"no expert parallelism (FSDP2 shards every parameter, experts included, over all "
                        f"ranks); set that axis to 1")
    return
  if expert_axis > 1:
    if experts % expert_axis:
      raise ConfigError("mesh.shape", f"an 'expert' mesh axis of size {expert_axis} does not divide the "
                        f"model's {experts} experts")
    target = dict((name, t) for name, t in config.mesh.rules).get("expert")
    if not (target == "expert" or (isinstance(target, (tuple, list)) and "expert" in target)):
      raise ConfigError("mesh.rules", f"the logical axis 'expert' (the expert kernels' first dimension) "
                        f"maps to {target!r}, not to the 'expert' mesh axis, so the experts would not be "
                        f"split: add ('expert', 'expert')")


def _check_section_keys(section, name: str, keys) -> None:
  """A section whose keys are exactly `keys`: an unknown or a missing one is named."""
  unknown, missing = sorted(set(section) - set(keys)), sorted(set(keys) - set(section))
  if unknown:
    raise ConfigError(name, f"unknown keys {unknown}" + (f", missing keys {missing}" if missing else ""))
  if missing:
    raise ConfigError(name, f"missing keys {missing}")


PREFERENCE_KEYS = ("mode", "beta", "label_smoothing", "dpop_lambda", "length_alpha", "sft_weight",
                   "simpo_gamma", "orpo_lambda")


OBJECTIVE_SECTIONS = {"dpo": "preference", "distill": "distill"}   # grpo.objective -> its grpo section


def _validate_objective(config) -> None:
  """grpo.objective: the policy-gradient step, online DPO (grpo.preference) or on-policy
  distillation (grpo.distill); each section only with its objective."""
  grpo = config.grpo
  if grpo.objective not in ("policy_gradient", "dpo", "distill"):
    raise ConfigError("grpo.objective", f"must be 'policy_gradient', 'dpo' or 'distill', got {grpo.objective!r}")
  for objective, section in OBJECTIVE_SECTIONS.items():
    if section in grpo and grpo.objective != objective:
      raise ConfigError(f"grpo.{section}", f"is read only with grpo.objective={objective!r}")
  if grpo.objective == "distill":
    _validate_distill(config)
  if grpo.objective != "dpo":
    return
  if "preference" not in grpo:
    raise ConfigError("grpo.preference", f"grpo.objective='dpo' needs the preference loss's options "
                      f"({', '.join(PREFERENCE_KEYS)}): see configs/online_dpo.py")
  _check_section_keys(grpo.preference, "grpo.preference", PREFERENCE_KEYS)
  from dockyard.dpo.loss_spec import PreferenceConfig   # NumPy only: no model, no backend
  try:
    PreferenceConfig.from_config(grpo.preference)
  except ValueError as err:   # "preference.<field> ..." -> the key it came from
    message = str(err).removeprefix("preference.")
    field = message.split(" ", 1)[0].split("=", 1)[0]
    raise ConfigError(f"grpo.preference.{field}" if field in PREFERENCE_KEYS else "grpo.preference",
                      message) from None
  if grpo.num_generations_per_prompt < 2:
    raise ConfigError("grpo.num_generations_per_prompt", "online DPO pairs the best and the worst "
                      f"of each prompt's completions: must be >= 2, got {grpo.num_generations_per_prompt}")
  if float(config.loss_fn.reference_policy_kl_penalty) != 0:
    raise ConfigError("loss_fn.reference_policy_kl_penalty", "is the policy-gradient loss's KL term; "
                      "online DPO's tie to the reference is grpo.preference.beta: set it to 0")
  if grpo.num_minibatches != 1:
    raise ConfigError("grpo.num_minibatches", "online DPO takes one preference step a batch: must be 1")
  _validate_packing(config, preference=True)
  _validate_pair_micro_batch(config)


DISTILL_KEYS = ("teachers", "weights", "reward_weight", "loss", "top_k", "combine")


def _validate_distill(config) -> None:
  """grpo.distill: teachers that exist (checked without loading), weights that mix them, and the
  samples every group keeps (a group flat in reward still carries the teachers' signal)."""
  grpo = config.grpo
  if "distill" not in grpo:
    raise ConfigError("grpo.distill", f"grpo.objective='distill' needs ({', '.join(DISTILL_KEYS)}): "
                      "see configs/distill.py")
  distill = grpo.distill
  _check_section_keys(distill, "grpo.distill", DISTILL_KEYS)
  teachers = tuple(distill.teachers)
  if not teachers:
    raise ConfigError("grpo.distill.teachers", "names no teacher: give one or more HF directories (or "
                      "package:<name>)")
  for spec in teachers:
    if str(spec).startswith("package:"):
      _check_package("grpo.distill.teachers", str(spec))
    elif not os.path.isfile(os.path.join(str(spec), "config.json")):
      raise ConfigError("grpo.distill.teachers", f"{spec!r} is not an HF model directory (no config.json; a "
                        f"run's checkpointed policy becomes one with `python -m dockyard.export --workdir=<run>`)")
  weights = tuple(float(w) for w in distill.weights)
  if weights and (len(weights) != len(teachers) or min(weights) < 0 or abs(sum(weights) - 1) > 1e-6):
    raise ConfigError("grpo.distill.weights", f"must be one weight >= 0 per teacher, summing to 1 (or "
                      f"empty: equal weights), got {list(weights)} for {len(teachers)} teachers")
  if distill.combine not in ("weighted", "select"):
    raise ConfigError("grpo.distill.combine", f"must be 'weighted' (the weights' sum) or 'select' (one "
                      f"teacher per prompt), got {distill.combine!r}")
  if distill.combine == "select" and weights:
    raise ConfigError("grpo.distill.weights", "are the weighted sum's; grpo.distill.combine='select' "
                      f"gives each prompt one teacher: leave them empty, got {list(weights)}")
  if float(distill.reward_weight) < 0:
    raise ConfigError("grpo.distill.reward_weight", f"must be >= 0, got {distill.reward_weight}")
  if distill.loss not in ("topk_kl", "sampled_token"):
    raise ConfigError("grpo.distill.loss", f"must be 'topk_kl' or 'sampled_token', got {distill.loss!r}")
  if distill.loss == "topk_kl":
    other = _teacher_with_another_tokenizer(config)
    if other is not None:
      raise ConfigError("grpo.distill.loss", f"'topk_kl' compares next-token distributions token by "
                        f"token, which needs one vocabulary, and teacher {other!r} has another tokenizer "
                        "than the student's: use loss='sampled_token' (aligned on text spans, "
                        "docs/distill.md) or a teacher that shares the student's tokenizer")
    if int(distill.top_k) < 1:
      raise ConfigError("grpo.distill.top_k", f"must be >= 1 (tokens per position), got {distill.top_k}")
    if float(config.loss_fn.reference_policy_kl_penalty) != 0:
      raise ConfigError("loss_fn.reference_policy_kl_penalty", "must be 0 with grpo.distill.loss="
                        "'topk_kl': the teachers are the anchor, and the penalty lives in the policy-"
                        "gradient loss that the top-k KL replaces (or use loss='sampled_token')")
    # The JAX trainer's token-budget micro-batches are unpacked rows and keep the top-k contract;
    # packed rows (both trainers) and the torch trainer's token-budget path do not.
    keys = ["policy.packing_row_tokens"] + (["optim.micro_batch_tokens"]
                                            if config.policy.backend == "torch" else [])
    for key in keys:
      section, name = key.split(".")
      if int(config[section].get(name, 0)):
        raise ConfigError(key, "must be 0 with grpo.distill.loss='topk_kl': the student's top-k "
                          "logprobs are gathered on unpacked rows of fixed micro-batches"
                          + (" on policy.backend='torch'" if key.startswith("optim") else ""))
  if grpo.dynamic_sampling:
    raise ConfigError("grpo.dynamic_sampling", "on-policy distillation learns from every sample "
                      "(a group flat in reward still has the teachers' per-token signal): set it False")


def _tokenizer_file(spec: str) -> str | None:
  """The tokenizer.json of a model spec (an HF directory, or a package:<name> already converted),
  where it is on disk without building or converting anything."""
  from dockyard.models import packaged
  if packaged.is_package_spec(spec):
    try:
      spec = packaged.cache_dir(packaged.lookup(spec))
    except packaged.PackagedModelError:
      return None
  path = os.path.join(spec, "tokenizer.json") if spec else ""
  return path if os.path.isfile(path) else None


def _teacher_with_another_tokenizer(config) -> str | None:
  """The first distillation teacher whose vocabulary differs from the student's, where both are on
  disk now (a tiny student that trains its tokenizer at build time is checked there instead,
  `policy_factory.make_update`)."""
  from tokenizers import Tokenizer

  def vocab(path):
    try:
      return Tokenizer.from_file(path).get_vocab(with_added_tokens=True)
    except Exception:   # a tokenizer.json that `tokenizers` cannot read: left to the build's check
      return None
  tiny = config.policy.tiny.get("tokenizer_from", "") if "tiny" in config.policy else ""
  student = str(config.policy.model_name_or_path or tiny or "")
  mine = _tokenizer_file(student)
  mine = vocab(mine) if mine else None
  if mine is None:
    return None
  for spec in config.grpo.distill.teachers:
    theirs = _tokenizer_file(str(spec)) if str(spec) != student else None
    theirs = vocab(theirs) if theirs else None
    if theirs is not None and theirs != mine:
      return str(spec)
  return None


def _validate_pair_micro_batch(config) -> None:
  micro = int(config.optim.micro_batch_size)
  if micro < 2 or micro % 2:
    raise ConfigError("optim.micro_batch_size", f"must be even for preference pairs (rows 2i and 2i+1, "
                      f"a pair's chosen and rejected completions, stay in one micro-batch), got {micro}")


def _validate_preference(config) -> None:
  """configs/dpo.py: the preference loss's options (PreferenceConfig's own checks, the one place
  for those rules), the loop's counts, and where the pairs come from."""
  _validate_policy(config)
  _validate_mesh(config)
  _validate_packing(config, preference=True)
  from dockyard.dpo.loss_spec import PreferenceConfig   # NumPy only: no model, no backend
  try:
    PreferenceConfig.from_config(config.dpo)
  except ValueError as err:   # "preference.<field> ..." -> the key it came from
    message = str(err).removeprefix("preference.")
    field = message.split(" ", 1)[0].split("=", 1)[0]
    raise ConfigError(f"dpo.{field}" if field in config.dpo else "dpo", message) from None
  dpo = config.dpo
  for key in ("num_steps", "num_pairs_per_step"):
    if int(dpo[key]) < 1:
      raise ConfigError(f"dpo.{key}", f"must be >= 1, got {dpo[key]}")
  for key in ("val_period", "generate_period"):
    if int(dpo[key]) < 0:
      raise ConfigError(f"dpo.{key}", f"must be >= 0 (0: never), got {dpo[key]}")
  _validate_pair_micro_batch(config)
  made = "rlaif" in config or "sampled_pairs" in config
  if "rlaif" in config and "sampled_pairs" in config:
    raise ConfigError("sampled_pairs", "a run makes its pairs one way: by RLAIF's critique and revision "
                      "(rlaif) or from the model's right and wrong samples (sampled_pairs), not both")
  if "rlaif" in config:   # the model makes its pairs from env.math's prompts (dockyard/rlaif.py)
    _validate_rlaif(config)
  elif "sampled_pairs" in config:   # ... from its own samples (dockyard/dpo/sampled.py)
    _validate_sampled_pairs(config)
  else:
    _validate_data_files(config, "preference pairs", "pairs")
  if not config.data.train or made or int(dpo.generate_period) > 0:
    _validate_math_env(config)
  if made or int(dpo.generate_period) > 0:
    _validate_local_engine(config, "dpo.generate_period")
  if int(dpo.generate_period) > 0:
    _check_canary(config.refit.canary)
  if int(config.checkpoint.save_period) < 1:
    raise ConfigError("checkpoint.save_period", f"must be >= 1, got {config.checkpoint.save_period}")


def _model_made_pairs_section(config, section: str, cls, makes: str):
  """`cls.from_config(config[section])` (its own checks: an error "<section>.<key> ..." names that
  key), and no pair files: the model makes the pairs (`makes` says how)."""
  try:
    cfg = cls.from_config(config[section])
  except ValueError as err:
    key = str(err).split(" ", 1)[0]
    raise ConfigError(key if key.startswith(f"{section}.") else section, str(err)) from None
  if config.data.train or config.data.validation:
    raise ConfigError("data.train", f"{makes}: leave data.train and data.validation ''")
  return cfg


def _validate_sampled_pairs(config) -> None:
  """configs/dpo.py:smollm: SampledPairsConfig's own checks, pairs only from the model."""
  from dockyard.dpo.sampled import SampledPairsConfig   # no model, no engine at import
  _model_made_pairs_section(config, "sampled_pairs", SampledPairsConfig,
                            "sampled_pairs makes the pairs from the model's own samples")
  if int(config.policy.max_seq_len) < int(config.rollout.max_new_tokens) + 64:
    raise ConfigError("policy.max_seq_len", f"a pair is the prompt + a sample of up to rollout.max_new_tokens="
                      f"{config.rollout.max_new_tokens} tokens: needs >= {int(config.rollout.max_new_tokens) + 64}")


def _validate_local_engine(config, period_key: str) -> None:
  """The in-process vLLM engine's settings (SFT's and DPO's generation metric, the pairs the model
  makes), and the held-out tasks the generation metric samples."""
  section, key = period_key.split(".")
  if int(config[section][key]) > 0 and int(config.env.math.num_validation) < 1:
    raise ConfigError("env.math.num_validation", f"the generation metric ({period_key} > 0) samples the "
                      f"held-out tasks: must be >= 1, or set {period_key}=0")
  rollout = config.rollout
  if int(rollout.tensor_parallel_size) < 1:
    raise ConfigError("rollout.tensor_parallel_size", f"must be >= 1, got {rollout.tensor_parallel_size}")
  if int(rollout.max_new_tokens) < 1:
    raise ConfigError("rollout.max_new_tokens", f"must be >= 1, got {rollout.max_new_tokens}")
  if rollout.max_new_tokens >= rollout.max_model_len:
    raise ConfigError("rollout.max_new_tokens", f"must be < rollout.max_model_len ({rollout.max_model_len})")
  if rollout.val_temperature < 0:
    raise ConfigError("rollout.val_temperature", f"must be >= 0 (0: greedy), got {rollout.val_temperature}")


def _validate_rlaif(config) -> None:
  """configs/rlaif.py: RlaifConfig's own checks, pairs only from the model, and an engine context
  that holds the revise turn (the prompt, the answer, the critique request and the critique)."""
  from dockyard.rlaif import RlaifConfig   # no model, no engine at import
  cfg = _model_made_pairs_section(config, "rlaif", RlaifConfig, "configs/rlaif.py makes its pairs with the model")
  need = 3 * cfg.max_new_tokens + 256
  if int(config.rollout.max_model_len) < need:
    raise ConfigError("rollout.max_model_len", f"the revise turn holds the prompt and three replies of up "
                      f"to rlaif.max_new_tokens={cfg.max_new_tokens}: needs >= {need}, got "
                      f"{config.rollout.max_model_len}")
  if int(config.policy.max_seq_len) < cfg.max_new_tokens + 64:
    raise ConfigError("policy.max_seq_len", f"a pair is the prompt + a reply of up to "
                      f"rlaif.max_new_tokens={cfg.max_new_tokens} tokens: needs >= {cfg.max_new_tokens + 64}")


def _validate_reward_model(config) -> None:
  """configs/rm.py: the backend, the loop's counts, the optimizer, and where the pairs come from."""
  _validate_backend_and_model(config)
  if int(config.policy.max_seq_len) < 2:
    raise ConfigError("policy.max_seq_len", f"must be >= 2, got {config.policy.max_seq_len}")
  rm = config.rm
  for key in ("num_steps", "num_pairs_per_step"):
    if int(rm[key]) < 1:
      raise ConfigError(f"rm.{key}", f"must be >= 1, got {rm[key]}")
  if int(rm.val_period) < 0:
    raise ConfigError("rm.val_period", f"must be >= 0 (0: no validation), got {rm.val_period}")
  optim = config.optim
  if not float(optim.lr) > 0:
    raise ConfigError("optim.lr", f"must be > 0, got {optim.lr}")
  if not float(optim.weight_decay) >= 0:
    raise ConfigError("optim.weight_decay", f"must be >= 0, got {optim.weight_decay}")
  if not float(optim.max_grad_norm) > 0:
    raise ConfigError("optim.max_grad_norm", f"must be > 0, got {optim.max_grad_norm}")
  _validate_data_files(config, "preference pairs", "pairs")
  if not config.data.train:
    _validate_math_env(config)


def _validate_data_files(config, what: str, made: str) -> None:
  """data.train / data.validation: files of `what` that exist, or both '' (`made` from env.math,
  whose held-out split is the validation set)."""
  if config.data.train:
    for key in ("train", "validation"):
      path = config.data[key]
      if path and not os.path.exists(path):
        raise ConfigError(f"data.{key}", f"no {what} file at {path!r}")
  elif config.data.validation:
    raise ConfigError("data.validation", f"set with data.train='' ({made} made from env.math, whose "
                      "held-out split is the validation set): give data.train too, or leave both ''")


def _validate_math_env(config) -> None:
  from dockyard.envs import math as math_env   # NumPy only: no model, no engine
  try:
    math_env.MathConfig.from_config(config)
  except ValueError as err:
    raise ConfigError("env.math", str(err).removeprefix("env.math.")) from None


def _validate_sft(config) -> None:
  """configs/sft.py: the loop's counts, where the chats come from, and the generation metric's
  engine (only when it runs)."""
  _validate_policy(config)
  _validate_mesh(config)
  sft = config.sft
  for key in ("num_steps", "batch_size"):
    if int(sft[key]) < 1:
      raise ConfigError(f"sft.{key}", f"must be >= 1, got {sft[key]}")
  for key in ("val_period", "generate_period"):
    if int(sft[key]) < 0:
      raise ConfigError(f"sft.{key}", f"must be >= 0 (0: never), got {sft[key]}")
  if int(config.optim.micro_batch_size) < 1:
    raise ConfigError("optim.micro_batch_size", f"must be >= 1, got {config.optim.micro_batch_size}")
  _validate_data_files(config, "chat data", "chats")
  _validate_math_env(config)   # the default chats, and the generation metric's tasks
  if int(sft.generate_period) > 0:
    _validate_local_engine(config, "sft.generate_period")
    _check_canary(config.refit.canary)
  if int(config.checkpoint.save_period) < 1:
    raise ConfigError("checkpoint.save_period", f"must be >= 1, got {config.checkpoint.save_period}")


def _validate_terminal(config) -> None:
  """env.terminal: the generated task set and its split (by family and/or by instance)."""
  if "agent" not in config:
    raise ConfigError("agent", "env.name='terminal' is played in sandbox sessions: the config needs "
                      "an agent section (see configs/terminal.py)")
  keys = {"seed", "tasks_per_family", "train_families", "heldout_families", "heldout_fraction"}
  if "terminal" not in config.env:
    raise ConfigError("env.terminal", f"missing ({', '.join(sorted(keys))})")
  from dockyard.data import terminal as terminal_data
  terminal = config.env.terminal
  _check_section_keys(terminal, "env.terminal", keys)
  if terminal.tasks_per_family < 1:
    raise ConfigError("env.terminal.tasks_per_family", f"must be >= 1, got {terminal.tasks_per_family}")
  for key in ("train_families", "heldout_families"):
    families = tuple(terminal[key])
    bad = sorted(set(families) - set(terminal_data.FAMILIES))
    if bad or (key == "train_families" and not families):
      raise ConfigError(f"env.terminal.{key}", f"must name families of {list(terminal_data.FAMILIES)}, "
                        f"got {list(families)}")
  both = sorted(set(terminal.train_families) & set(terminal.heldout_families))
  if both:
    raise ConfigError("env.terminal.heldout_families", f"{both} are also train families: a family "
                      "is held out whole or split by heldout_fraction, not both")
  fraction, n = float(terminal.heldout_fraction), int(terminal.tasks_per_family)
  if not 0.0 <= fraction < 1.0 or (fraction > 0 and not 1 <= round(n * fraction) < n):
    raise ConfigError("env.terminal.heldout_fraction", f"must hold out at least one and keep at least "
                      f"one of each train family's {n} tasks (a value in [0, 1)), got {fraction}")
  if not terminal.heldout_families and fraction == 0:
    raise ConfigError("env.terminal.heldout_families", "nothing is held out: name held-out families "
                      "or set env.terminal.heldout_fraction > 0")

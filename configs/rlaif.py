r"""RLAIF, constitutional style: the model critiques and revises its own answers against a written
constitution, and DPO-family steps train it to prefer its revisions (dockyard/rlaif.py).

configs/dpo.py (the same loss options, loop, checkpoints and validation) with an `rlaif` section
that replaces the pairs: before training, a vLLM engine in this process serves the initial weights
and, for each of env.math's prompts, samples an answer, a critique of it against one principle of
`rlaif.constitution`, and a revision; chosen = revision, rejected = answer
(`<workdir>/rlaif_pairs.jsonl` keeps them all). The held-out prompts' pairs are validation's
(`val/chosen_preferred`: how often the policy prefers its own revision). The embedded default runs
the tiny model on configs/math.py's single-digit sums (its critiques are noise: it shows the
mechanics); `:smollm` runs SmolLM2-135M-Instruct on two-digit + and -:

  python -m dockyard.launch --config=configs/rlaif.py --workdir=workdirs/rlaif
  python -m dockyard.launch --config=configs/rlaif.py:smollm --workdir=workdirs/rlaif_smollm

`:mode=` and `:torch` as in configs/dpo.py. `:smollm` trains as configs/dpo.py:smollm does (pure DPO,
30 steps of 16 pairs, held-out greedy pass@1 every 10 steps); only the pairs differ. docs/rlaif.md.
"""
from configs import dpo as dpo_config
from dockyard import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, torch=False, mode="dpo", smollm=False)
  config = dpo_config.get_config(",".join(filter(None, ["torch" if arg.torch else "", f"mode={arg.mode}"])))
  config.run.name = f"rlaif_{arg.mode}_{'smollm' if arg.smollm else 'tiny'}"

  # rlaif: how the pairs are made (dockyard/rlaif.py). The principles are taken in turn, one a prompt.
  config.rlaif = dict(
      constitution=(
          "The reply gives the final result as a number.",
          "The arithmetic in the reply is correct.",
          "The reply is short and to the point.",
      ),
      temperature=1.0,          # the answer, the critique and the revision are sampled
      max_new_tokens=16,        # each of the three
      num_train_prompts=80,     # of env.math's train split (the tiny set has 80)
      num_val_prompts=20,       # of its held-out split: validation's pairs
  )
  # rollout: the engine that writes them (in this process; sized for the three-turn conversation).
  config.rollout.max_model_len = 512
  if arg.smollm:   # configs/dpo.py:smollm's model, task, loop and generation metric; these pairs
    dpo_config.smollm(config)
    del config["sampled_pairs"]
    config.run.name = f"rlaif_{arg.mode}_smollm"
    config.rlaif.update(max_new_tokens=48, num_train_prompts=400, num_val_prompts=100)
    config.rollout.max_model_len = 512
  return config


def get_hyper(h, arg=None):
  """The sweep: beta (half and double the mode's) x the rate (half and double)."""
  config = get_config(arg)
  lr, beta = config.optim.lr, config.dpo.beta
  return h.product([h.sweep("config.dpo.beta", [beta / 2, beta * 2]), h.sweep("config.optim.lr", [lr / 2, lr * 2])])

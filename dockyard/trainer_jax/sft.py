"""Standalone supervised fine-tuning of a JaxPolicy with a masked NLL, from the command line.

Not the GRPO warm start (that is `dockyard.grpo.sft`); both run the one SFT loop,
`dockyard.sft.sft_loop`, through the Policy seam. This one owns its grain pipeline and orbax
checkpoints, for SFT on its own from a JSONL of {"prompt", "answer"} records.

`run_sft` reads top to bottom: build the grain pipeline and the checkpoint manager; restore if the
workdir has a checkpoint; run the steps from there to `total_steps`, logging each and saving every
`save_every`. Re-running into the same workdir continues exactly where the last run stopped.

  python -m dockyard.trainer_jax.sft --model=DIR --data=train.jsonl --workdir=W --steps=6
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable, Sequence

import numpy as np

from dockyard.policy import TrainBatch
from dockyard.sft import sft_loop
from dockyard.trainer_jax import data as data_lib
from dockyard.trainer_jax.loss import nll_loss
from dockyard.trainer_jax.policy import JaxPolicy


def encode_records(encode: Callable[[str], list[int]], pairs: Sequence[tuple[str, str]]) -> list[dict]:
  """(prompt, answer) text pairs -> {'ids', 'prompt_len'} token records (answer gets trained)."""
  out = []
  for prompt, answer in pairs:
    p, a = list(encode(prompt)), list(encode(answer))
    out.append({"ids": np.asarray(p + a, np.int32), "prompt_len": np.int32(len(p))})
  return out


def to_example(seq_len: int):
  """Record -> fixed-length arrays; only answer tokens are in the loss mask."""
  def fn(rec: dict) -> dict:
    ids, mask = data_lib.pad_right([rec["ids"]], seq_len)
    loss = mask.copy()
    loss[0, :int(rec["prompt_len"])] = 0
    return {"input_ids": ids[0], "attention_mask": mask[0], "loss_mask": loss[0]}
  return fn


def run_sft(policy: JaxPolicy, records: Sequence[dict], workdir: str, total_steps: int, *,
            batch_size: int, seq_len: int, seed: int = 0, lr: float | None = None,
            stop_after: int | None = None, save_every: int = 1, log=print) -> list[dict[str, Any]]:
  """Trains to `total_steps` (resuming from `workdir/checkpoints`); returns this run's metrics."""
  it = iter(data_lib.pipeline(records, batch_size, seed=seed, transform=to_example(seq_len)))
  ckpt = policy.checkpointer(os.path.join(workdir, "checkpoints"))
  if ckpt.latest_step() is not None:
    meta = policy.restore(ckpt.directory, data_iter=it)
    log(f"resumed from step {meta['step']}")
  batches = (TrainBatch(ex["input_ids"], ex["attention_mask"], ex["loss_mask"]) for ex in it)
  history = []

  def record(step: int, metrics: dict[str, float], seconds: float) -> None:
    history.append({"step": step + 1, **metrics})
    log(json.dumps(history[-1]))

  def save(step: int) -> None:
    if (step + 1) % save_every == 0 or step + 1 == total_steps:
      policy.save(ckpt.directory, data_iter=it)   # the grain iterator's state with the weights

  # `stop_after` ends the run after that step as a kill would (at least one step when resuming
  # past it); the checkpoints still follow `save_every`.
  end = total_steps if stop_after is None else min(total_steps, max(stop_after, policy.step + 1))
  sft_loop(policy, batches, range(policy.step, end), nll_loss, lr=lr, on_step=record, save=save)
  return history


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", required=True, help="HF checkpoint directory")
  ap.add_argument("--data", required=True, help="JSONL of {'prompt': str, 'answer': str}")
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--steps", type=int, required=True)
  ap.add_argument("--stop_after", type=int, default=None, help="exit (as if killed) after this step")
  ap.add_argument("--batch_size", type=int, default=8)
  ap.add_argument("--seq_len", type=int, default=64)
  ap.add_argument("--lr", type=float, default=None)
  ap.add_argument("--save_every", type=int, default=1, help="checkpoint period in steps")
  ap.add_argument("--config", default="configs/swe.py", help="experiment config file[:arg]")
  ap.add_argument("--dump", default=None, help="write the final parameters here (.npz)")
  args = ap.parse_args(argv)

  from tokenizers import Tokenizer  # the fast tokenizer alone: no transformers import needed
  from dockyard.validate import load_config_file
  config = load_config_file(args.config)
  config.grpo.max_num_steps = max(args.steps, config.optim.warmup_steps + 1)
  config.optim.micro_batch_size = min(config.optim.micro_batch_size, args.batch_size)
  tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
  with open(args.data) as f:
    pairs = [(r["prompt"], r["answer"]) for r in map(json.loads, f)]
  policy = JaxPolicy.from_hf(args.model, config)
  run_sft(policy, encode_records(lambda text: tok.encode(text).ids, pairs), args.workdir, args.steps, batch_size=args.batch_size,
          seq_len=args.seq_len, lr=args.lr, stop_after=args.stop_after,
          save_every=args.save_every)
  if args.stop_after is not None and policy.step < args.steps:
    os._exit(0)  # "killed": no dump, no teardown; only the checkpoint on disk survives
  if args.dump:
    np.savez(args.dump, step=policy.step, **dict(policy.named_weights()))
  # Exit without interpreter teardown, like a killed job: nothing after the last save may matter.
  os._exit(0)


if __name__ == "__main__":
  main()

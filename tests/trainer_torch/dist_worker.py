"""The torchrun worker of the distributed tests: train, save/restore, dump what the test compares.

  torchrun --nproc_per_node=2 tests/trainer_torch/dist_worker.py MODEL OUT [--restore CKPT]
      [--micro_batch_size N] [--packing_row_tokens L]

Without --restore: 2 steps, save OUT/ckpt (-> OUT/ckpt/2/), 2 more steps. With it: restore, 2 steps. Rank 0
writes OUT/result.npz (per-step metrics + final weights); every rank writes its local shard
shapes to OUT/shards_rank{r}.json.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]  # the repo root, torch_common

import numpy as np  # noqa: E402

from dockyard.trainer_torch import dist as tdist  # noqa: E402
from dockyard.trainer_torch.loss import make_pg_loss  # noqa: E402
from dockyard.trainer_torch.policy import TorchPolicy  # noqa: E402
import torch_common as common  # noqa: E402


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("model")
  ap.add_argument("out")
  ap.add_argument("--restore", default="")
  ap.add_argument("--micro_batch_size", type=int, default=2)
  ap.add_argument("--packing_row_tokens", type=int, default=0)
  args = ap.parse_args()
  cfg = common.make_config(micro_batch_size=args.micro_batch_size)
  cfg.policy.packing_row_tokens = args.packing_row_tokens
  policy = TorchPolicy.from_hf(args.model, cfg)
  loss_fn = make_pg_loss(common.loss_config(cfg))
  rank = tdist.rank()
  shards = {n: dict(local=list(p.to_local().shape), full=list(p.shape), placements=str(p.placements))
            for n, p in policy.model.named_parameters()}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"shards_rank{rank}.json"), "w") as f:
    json.dump(dict(world=tdist.world_size(), shards=shards), f)

  metrics = []
  if args.restore:
    policy.restore(args.restore)
  steps = range(policy.step, policy.step + 2) if args.restore else range(4)
  for step in steps:
    batch = common.make_batch(seed=step)
    batch = common.with_prev(batch, policy.logprobs(batch), seed=100 + step)
    metrics.append(policy.train_step(batch, loss_fn))
    if not args.restore and policy.step == 2:
      policy.save(os.path.join(args.out, "ckpt"))
  weights = dict(policy.named_weights())  # a collective: every rank iterates
  if rank == 0:
    np.savez(os.path.join(args.out, "result.npz"), step=policy.step,
             loss=[m["loss"] for m in metrics], grad_norm=[m["grad_norm"] for m in metrics],
             **{"w/" + k: v for k, v in weights.items()})


if __name__ == "__main__":
  main()

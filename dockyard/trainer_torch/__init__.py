"""dockyard.trainer_torch: the second trainer (an HF transformers model under FSDP2), behind the
same `dockyard.policy.Policy` seam as the JAX one and checked against it (`policy.backend=torch`).

  policy.py        TorchPolicy, the `dockyard.policy.Policy` implementation
  loss.py          the clipped-PG and SFT NLL `LossFn`s in torch, following dockyard.grpo.loss_spec
  preference_loss.py  the DPO-family preference `LossFn` in torch, following dockyard.dpo.loss_spec
  optim.py         AdamW with warmup + cosine decay and global-norm clipping (the JAX semantics)
  dist.py          the process group, the FSDP mesh, how a global batch splits over ranks
  checkpoint.py    torch distributed checkpoints, laid out like the JAX trainer's
"""

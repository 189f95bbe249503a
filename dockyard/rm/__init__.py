"""dockyard.rm: a reward model (a scalar head on the decoder) trained on preference pairs with the
Bradley-Terry loss, independent of the training backend (it drives the `RewardModel` seam).

  loss_spec.py    the Bradley-Terry loss (+ per-pair margin) in NumPy: THE spec that
                  trainer_jax/reward_loss.py and trainer_torch/reward_loss.py follow
  model.py        the `RewardModel` seam (scores [B] of right-padded rows; train; save as HF)
  data.py         pairs (+ optional per-pair margin) from the math env or TRL-schema JSONL
  loop.py         `rm_train`: the training loop configs/rm.py runs (via dockyard.runner)
The trained model scores a GRPO environment's completions through `dockyard.envs.reward_model`.
"""

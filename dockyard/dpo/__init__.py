"""dockyard.dpo: preference training, the DPO family (DPO, cDPO, DPOP, R-DPO, IPO, SimPO,
ORPO, + an SFT blend), independent of the training backend (it drives the `Policy` seam).

  loss_spec.py    the preference loss in NumPy: THE spec that trainer_jax/preference_loss.py and
                  trainer_torch/preference_loss.py (the backends' `LossFn`s) follow
  data.py         preference pairs (math-env pairs, TRL-schema JSONL) -> interleaved TrainBatches
  loop.py         `dpo_train`: the training loop configs/dpo.py runs (via dockyard.runner)
  online.py       online DPO: the GRPO loop's update under `grpo.objective='dpo'` (configs/online_dpo.py)
"""

"""dockyard.dpo: the DPO family of preference losses (DPO, cDPO, DPOP, R-DPO, IPO, SimPO, ORPO),
independent of the training backend. The loop and its config are not built yet.

  loss_spec.py    the preference loss in NumPy: THE spec that trainer_jax/preference_loss.py and
                  trainer_torch/preference_loss.py (the backends' `LossFn`s) follow
"""

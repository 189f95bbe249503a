"""dockyard.grpo: the algorithm, independent of the training backend and the inference engine.

  loss_spec.py    the clipped policy-gradient loss (and SFT NLL) in NumPy: THE spec
  loss_jax.py     the same losses as JAX `LossFn`s, tested against the spec
  advantages.py   grpo (leave-one-out) | gdpo (per-component) | reinforce++ estimators
  shaping.py      reward scale, malformed and DAPO overlong penalties
  batch.py        `Group` records and packing into a `TrainBatch`
  sft.py          the SFT warm start on gold answers
  checkpoints.py  latest (resume) + best-k by a validation metric
  sync_loop.py    step pieces (collect / score / advantages / train / refit / validate) and
                  `grpo_train`, the synchronous loop that composes them
"""

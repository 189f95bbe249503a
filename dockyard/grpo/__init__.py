"""dockyard.grpo: the algorithm, independent of the training backend and the inference engine.

  loss_spec.py    the clipped policy-gradient loss (and SFT NLL) in NumPy: THE spec that
                  trainer_jax/loss.py and trainer_torch/loss.py (the backends' `LossFn`s) follow
  advantages.py   grpo (leave-one-out) | gdpo (per-component) | reinforce++ estimators
  shaping.py      reward scale, malformed and DAPO overlong penalties
  batch.py        `Group` records and packing into a `TrainBatch`
  sft.py          the SFT warm start on gold answers (its steps: dockyard.sft.sft_loop)
  checkpoints.py  latest (resume) + best-k by a validation metric
  step.py         the step pieces: prompt sampling, collect / score / advantages / update / refit
  harness.py      around the steps: settings, validation + best-k, resume / warm start,
                  checkpoints, progress, the run's result
  source.py       the `TrajectorySource` seam; `SyncSource` (generate + score on demand)
  episodes.py     multi-turn agent episodes as scored groups (per-token loss masks), for either source
  async_source.py `AsyncSource`: the collector thread feeding the age-bounded buffer
  age_buffer.py   `AgeBoundedBuffer`: scored groups between collector and trainer, age-bounded
  loop.py         `grpo_train`: the one loop over a trajectory source
"""

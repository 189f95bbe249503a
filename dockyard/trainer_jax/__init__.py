"""dockyard.trainer_jax: the main trainer (Flax NNX decoder on a device mesh, optax, orbax, grain).

  model.py         the Qwen2 / Qwen3 / Llama / Qwen3-MoE decoder with logical axis names (its
                   ModelConfig and the HF name map are dockyard.models', shared with the torch trainer)
  moe.py           Mixture-of-Experts training: router aux / z losses, load metrics, the
                   aux-loss-free balancing bias
  sharding.py      mesh + logical rules -> NamedShardings
  hf_io.py         HF safetensors <-> NNX through dockyard.models.name_map
  train.py         AdamW schedule, jitted train_step (micro-batch accumulation) and logprob_step
  checkpoint.py    one orbax CheckpointManager: model + optimizer + step + grain iterator
  data.py          grain MapDataset pipelines
  policy.py        JaxPolicy, the `dockyard.policy.Policy` implementation
  loss.py          the clipped-PG and SFT NLL `LossFn`s in JAX, following dockyard.grpo.loss_spec
  preference_loss.py  the DPO-family preference `LossFn` in JAX, following dockyard.dpo.loss_spec
  sft.py           standalone masked-NLL SFT and its CLI: grain data, orbax checkpoints, resume
                   from its workdir; its steps are dockyard.sft.sft_loop, the one SFT loop, which
                   the GRPO warm start (dockyard.grpo.sft) runs too
"""

"""dockyard: post-trains language models with asynchronous GRPO against rewards from real code execution.

The rooms (see DESIGN in the README): `trainer_jax` / `trainer_torch` (policies), `refit` (weights
trainer -> vLLM), `rollout` (vLLM engines on Ray), `sandbox` (the task executor), `envs` (task +
completion -> reward), `grpo` (the algorithm and loops), `data` (task sets), `launch` (entry point).
"""
__version__ = "0.1.0"

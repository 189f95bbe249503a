"""dockyard.rollout: sampling from vLLM behind the `Generator` seam.

base.py (the ABC and records), vllm_engine.py (one in-process engine), fleet.py (engines as Ray
actors), worker_ext.py (methods vLLM workers run for refit), wire.py (the weight-update wire
format and broadcast group, shared with dockyard.refit), chat.py (messages -> prompt ids).
"""

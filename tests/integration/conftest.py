"""Integration tests: whole runs through `python -m dockyard.launch` with real parts (Ray, CPU vLLM,
the JAX trainer). They spawn subprocesses, so this file only sets what those children inherit."""
import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

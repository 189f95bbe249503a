"""bench/gpu.py stays runnable on the GPU machine, which has no vLLM, Ray, grain or ml_collections.

Its smoke run is in test_bench_smoke.py. Here: importing it (all its imports are at the top) loads
none of those, and its model shapes are Qwen2.5-0.5B's and 1.5B's (their published parameter counts).
"""
from __future__ import annotations

import os
import runpy
import subprocess
import sys

import jax
from flax import nnx

from dockyard.trainer_jax.hf_io import abstract_decoder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABSENT_ON_GPU_MACHINE = ("ray", "vllm", "grain", "ml_collections")


def test_gpu_bench_imports_nothing_the_gpu_machine_lacks():
  code = ("import runpy, sys; runpy.run_path('bench/gpu.py');"
          f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({ABSENT_ON_GPU_MACHINE!r})))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_gpu_bench_model_shapes_are_qwen2_5():
  models = runpy.run_path(os.path.join(ROOT, "bench", "gpu.py"))["MODELS"]
  for name, published in (("0p5b", 494_032_768), ("1p5b", 1_543_714_304)):
    params = jax.tree.leaves(nnx.state(abstract_decoder(models[name]), nnx.Param))
    assert sum(p.size for p in params) == published, name

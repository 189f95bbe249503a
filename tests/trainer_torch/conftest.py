"""Fixtures for the torch trainer tests: a tiny HF checkpoint made locally, policies built on it,
and one pair of real `torchrun --nproc_per_node=2` (gloo) runs shared by the distributed tests."""
import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch_common  # noqa: E402


@pytest.fixture(scope="session")
def model_path():
  from dockyard.models.tiny import make_tiny_model
  return make_tiny_model(torch_common.SPEC)


@pytest.fixture(scope="session")
def build_policy(model_path):
  """Builds a fresh one-rank TorchPolicy (a gloo group of one in this process)."""
  import torch
  torch.set_num_threads(1)  # the machine's 2 cores are shared; one thread is also deterministic
  from dockyard.trainer_torch.policy import TorchPolicy

  def build(**overrides):
    return TorchPolicy.from_hf(model_path, torch_common.make_config(**overrides))
  return build


def _torchrun(out: str, *args: str) -> None:
  env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
  cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         os.path.join(HERE, "dist_worker.py"), *args]
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
  if proc.returncode != 0:
    raise RuntimeError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")


@pytest.fixture(scope="session")
def torchrun_runs(model_path, tmp_path_factory):
  """Run A: 2 ranks, 4 steps, DCP save after step 2. Run B: fresh processes restore A's
  checkpoint and take steps 3-4. Returns the two output directories."""
  root = tmp_path_factory.mktemp("torchrun")
  a, b = str(root / "a"), str(root / "b")
  _torchrun(a, model_path, a)
  _torchrun(b, model_path, b, "--restore", os.path.join(a, "ckpt"))
  return a, b

"""The async GRPO loop on the experience data plane (`rollout.data_plane='object_store'`) through
`python -m dockyard.launch`, as a user starts it: configs/math.py's tiny default, three steps
whose groups the experience worker generated and scored and the trainer read from Ray's object
store. (The sync source on the plane runs in bench/data_plane.py's smoke mode, on a simulated
cluster, in tests/bench.)"""
import math

import pytest

from dockyard import validate
from tests.integration.launched import launch


@pytest.mark.slow
def test_async_grpo_trains_on_groups_from_the_data_plane(tmp_path):
  proc, rows = launch(str(tmp_path / "run"), "--config=configs/math.py", "--config.grpo.max_num_steps=3",
                      "--config.grpo.async_grpo.enabled=True", "--config.rollout.data_plane=object_store",
                      "--config.grpo.sft_warmup.steps=20", "--config.grpo.val_period=0")
  assert "starting the experience workers of the data plane" in proc.stdout + proc.stderr
  steps = [r for r in rows if "train/loss" in r]
  assert [r["step"] for r in steps] == [1, 2, 3]
  per_step = validate.load_config_file("configs/math.py").grpo.num_prompts_per_step
  groups = sum(r["data_plane/groups"] for r in steps)
  assert groups >= 3 * per_step                       # every trained group came over the plane
  assert all(r["data_plane/shared_bytes"] > 0 for r in steps if r["data_plane/groups"] > 0)
  assert all(math.isfinite(r["reward/raw_mean"]) and r["perf/driver_io_bytes"] > 0 for r in steps)
  assert [r["weight_version"] for r in steps] == sorted({r["weight_version"] for r in steps})   # a refit a step

"""Bytes through the driver per GRPO step: the colocated path vs the experience data plane.

  python bench/data_plane.py             # configs/swe.py:tiny, SFT warm start, 4 steps a side (~6 min here)
  python bench/data_plane.py --quick     # configs/math.py:tiny, 3 steps a side (about a minute)
  python bench/data_plane.py --smoke     # math, 2 prompts x 2 samples, 2 steps a side (CI)

Both sides run in one process on one simulated three-node Ray cluster (`ray.cluster_utils.Cluster`:
a trainer head, an inference node, a sandbox node, each advertising its fleet role, as in
tests/launch/test_fleet_roles.py), with one JAX trainer, one vLLM engine on the inference node and
(SWE) the sandbox executor on the sandbox node: the real loop (`grpo.loop.grpo_train`) with the sync
source, first colocated (`rollout.data_plane=None`: the driver generates, decodes, sends patches
to the sandbox and reads the verdicts), then with `rollout.data_plane='object_store'` (an
experience worker beside the engine generates and scores; the driver maps the group from the object
store). The second side continues from the first side's weights (the same policy object, a few
steps further on).

Per step the loop logs `perf/driver_io_bytes`: the bytes sent and received on the driver
process's TCP sockets during the step's take + update + refit (the kernel's tcp_info counters:
engine replies and Ray's control messages over gRPC, HTTP to the sandbox;
`grpo.harness.driver_io_bytes`). Memory mapped from Ray's shared-memory store is not in it. Printed per side (step 1 left out: it compiles): mean bytes per
step, mean step time, and for the data plane the bytes of groups the trainer mapped from the object
store; then the bytes of an idle window as long as a step (Ray's own background traffic).
The data plane's experience bytes through the driver are 0 by construction: what is left is the
task index and sampling settings out, an ObjectRef and weight versions back, and Ray's control
traffic. Last line:
  RESULT data_plane_driver_bytes_ratio <data plane bytes / colocated bytes per step> x
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def make_config(args, address: str):
  from dockyard import validate
  config = validate.load_config_file(os.path.join(ROOT, "configs", f"{args.env}.py:tiny"))
  grpo = config.grpo
  grpo.max_num_steps, grpo.val_at_start, grpo.val_period = args.steps, False, 0
  if args.prompts:
    grpo.num_prompts_per_step = args.prompts
  if args.generations:
    grpo.num_generations_per_prompt = args.generations
  if args.warmup is not None:
    grpo.sft_warmup.steps = args.warmup
  config.run.ray_address = address
  if args.max_new_tokens:
    config.rollout.max_new_tokens = args.max_new_tokens
  config.logging.tensorboard = False
  config.sandbox.num_executors, config.sandbox.slots, config.sandbox.cpus_per_executor = 1, 2, 1.0
  config.rollout.cpus_per_engine = 1.0
  validate.validate(config)
  return config


def side(name: str, config, parts, plane, env, workdir: str) -> dict:
  from dockyard import policy_factory
  from dockyard.grpo.loop import grpo_train
  from dockyard.grpo.source import make_source
  source = make_source(config, generator=parts["fleet"], env=env, tokenizer=parts["tokenizer"],
                       train_tasks=parts["train"], synchronizer=parts["sync"], plane=plane)
  t0 = time.perf_counter()
  grpo_train(config, source=source, policy=parts["policy"], generator=parts["fleet"], synchronizer=parts["sync"],
             env=env, tokenizer=parts["tokenizer"], train_tasks=parts["train"], val_tasks=[], workdir=workdir,
             losses=policy_factory.make_losses(config), update=policy_factory.make_update(config, parts["tokenizer"]),
             reference=lambda: policy_factory.make_policy(config, parts["model_path"]), progress=False)
  wall = time.perf_counter() - t0
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [r for r in map(json.loads, f) if "perf/driver_io_bytes" in r][1:]   # step 1 compiles
  mean = lambda k: sum(r[k] for r in rows) / len(rows)
  out = dict(name=name, steps=len(rows), driver_bytes=mean("perf/driver_io_bytes"), step_s=mean("time/step"),
             reward=mean("reward/raw_mean"), wall_s=wall)
  print(f"{name:>13}: {out['driver_bytes'] / 1e3:9.1f} KB through the driver per step, "
        f"{out['step_s']:6.2f} s a step, reward {out['reward']:.3f} ({len(rows)} steps timed)", flush=True)
  return out


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="math, 3 steps a side")
  ap.add_argument("--smoke", action="store_true", help="math, 2 prompts x 2 samples, 2 steps a side")
  ap.add_argument("--env", default=None, help="swe | math (default: swe; math for --quick/--smoke)")
  ap.add_argument("--steps", type=int, default=None)
  ap.add_argument("--prompts", type=int, default=0)
  ap.add_argument("--generations", type=int, default=0)
  ap.add_argument("--max_new_tokens", type=int, default=0, help="rollout.max_new_tokens (0: the config's)")
  ap.add_argument("--warmup", type=int, default=None, help="SFT warm-start steps (first side only)")
  ap.add_argument("--report", default="", help="write the figures as JSON here")
  args = ap.parse_args(argv)
  small = args.quick or args.smoke
  args.env = args.env or ("math" if small else "swe")
  args.steps = args.steps or (2 if args.smoke else 3 if args.quick else 5)
  if args.smoke:
    args.prompts, args.generations = args.prompts or 2, args.generations or 2
  if small and args.warmup is None:
    args.warmup = 0

  import ray
  from dockyard import policy_factory, ray_utils, runner
  from dockyard.refit.synchronizer import create_weight_synchronizer
  from dockyard.rollout.fleet import RolloutFleet

  cluster, role_nodes = ray_utils.role_cluster(("inference", "sandbox"), num_cpus=2)
  nodes = {role: ids[0] for role, ids in role_nodes.items()}
  try:
    config = make_config(args, cluster.address)
    ray_utils.init_ray(cluster.address)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
      stack.callback(ray.shutdown)
      model_path, tokenizer = runner.model_and_tokenizer(config)
      env, train, _, _ = runner.build_env(config, tokenizer, stack)
      policy = policy_factory.make_policy(config, model_path)
      fleet = RolloutFleet(config, model_path)
      stack.callback(fleet.shutdown)
      parts = dict(fleet=fleet, tokenizer=tokenizer, train=train, policy=policy, model_path=model_path,
                   sync=create_weight_synchronizer(config, policy, fleet))
      plane_config = config.copy_and_resolve_references()
      plane_config.rollout.data_plane = "object_store"
      plane_config.grpo.sft_warmup.steps = 0    # the policy is already warm from the first side
      plane = runner.data_plane(plane_config, fleet, env, train, model_path, stack)
      workers_on = sorted({info["node_id"] for info in plane.infos})
      print(f"cluster: trainer {nodes['trainer'][:8]}, inference {nodes['inference'][:8]}, sandbox "
            f"{nodes['sandbox'][:8]}; engine + experience workers on {[n[:8] for n in workers_on]}", flush=True)
      colocated = side("colocated", config, parts, None, env, os.path.join(tmp, "colocated"))
      # the first side's source closed its env (and its sandbox client): the second scores with its own
      urls = tuple(getattr(getattr(env, "client", None), "urls", ()))
      env2, _ = runner.worker_env(config, urls, tokenizer)
      on_plane = side("object_store", plane_config, parts, plane, env2, os.path.join(tmp, "object_store"))
      shared = plane.shared_bytes / max(plane.groups, 1) * plane_config.grpo.num_prompts_per_step
      print(f"{'':>13}  {shared / 1e3:9.1f} KB of groups a step mapped from the object store", flush=True)
      from dockyard.grpo.harness import driver_io_bytes
      io0 = driver_io_bytes()
      time.sleep(on_plane["step_s"])
      idle = driver_io_bytes() - io0
      print(f"{'idle':>13}: {idle / 1e3:9.1f} KB in a step-long idle window (Ray's background traffic)", flush=True)
      report = dict(env=args.env, nodes=nodes, workers_on=workers_on, colocated=colocated, object_store=on_plane,
                    shared_bytes_per_step=shared, idle_bytes_per_step=idle,
                    ratio=on_plane["driver_bytes"] / max(colocated["driver_bytes"], 1.0))
      if args.report:
        with open(args.report, "w") as f:
          json.dump(report, f, indent=1)
  finally:
    ray.shutdown()
    cluster.shutdown()
  print(f"RESULT data_plane_driver_bytes_ratio {report['ratio']:.4f} x", flush=True)


if __name__ == "__main__":
  main()

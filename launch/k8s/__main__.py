r"""Prints the Kubernetes manifests for a config as one YAML stream (see launch/k8s/__init__.py).

  python -m launch.k8s --config=configs/swe.py:full > dockyard.yaml      # then: kubectl apply -f dockyard.yaml
  python -m launch.k8s --config=configs/swe.py:full --check              # validate offline, print nothing else
  python -m launch.k8s --config=configs/swe.py:full --ray_kind=RayCluster --override=--config.grpo.num_prompts_per_step=32

The config is loaded and validated as `dockyard.launch` would (overrides included), so a manifest
is never rendered for a config the run would refuse.
"""
from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

import launch.k8s as k8s
from dockyard import validate

_CONFIG = flags.DEFINE_string("config", None, "Config file[:arg], as for dockyard.launch.")
_NAME = flags.DEFINE_string("name", None, "Name prefix of every object; default: config.run.name.")
_NAMESPACE = flags.DEFINE_string("namespace", "dockyard", "Kubernetes namespace.")
_IMAGE = flags.DEFINE_string("image", "dockyard/trainer:latest", "Trainer/inference image (docker/trainer.Dockerfile).")
_SANDBOX_IMAGE = flags.DEFINE_string("sandbox_image", "dockyard/ubuntu-swe:latest",
                                     "Sandbox image (docker/ubuntu-swe.Dockerfile).")
_RAY_KIND = flags.DEFINE_enum("ray_kind", "RayJob", ["RayJob", "RayCluster"],
                              "RayJob: the cluster runs the training command and goes away; RayCluster: "
                              "a cluster to `ray job submit` to.")
_NODE_CPUS = flags.DEFINE_integer("node_cpus", 32, "CPU request (= limit) of each Ray pod.")
_NODE_MEMORY = flags.DEFINE_string("node_memory", "256Gi", "Memory request (= limit) of each Ray pod.")
_SANDBOX_SLOTS = flags.DEFINE_integer("sandbox_slots", 4, "Concurrent test runs per sandbox pod (= its CPUs).")
_SANDBOX_POD = flags.DEFINE_enum("sandbox_pod", "executor", ["executor", "hardened"],
                                 "executor: the privileges today's executor isolation needs, root only "
                                 "inside a user-namespaced pod; hardened: non-root, no capabilities, which "
                                 "today's executor cannot run in (docs/deployment.md).")
_WORKDIR_CLAIM = flags.DEFINE_string("workdir_claim", "", "PVC mounted at /workdir; '' : emptyDir (lost with the pod).")
_REPOS_CLAIM = flags.DEFINE_string("repos_claim", "", "PVC holding the task repos, mounted read-only in the sandbox.")
_OVERRIDE = flags.DEFINE_multi_string("override", [], "A --config.* flag for the training command (repeatable).")
_CHECK = flags.DEFINE_bool("check", False, "Validate offline (kubernetes-validate + the shipped KubeRay subset).")
_K8S_VERSION = flags.DEFINE_string("kubernetes_version", "1.33", "Kubernetes version --check validates against.")


def load_config(spec: str, overrides: list[str]):
  """The config `dockyard.launch --config=spec <overrides>` would run: the overrides checked by
  validate.check_overrides (a typo names its key), then parsed by ml_collections' config_flags,
  the parser dockyard.launch uses, on a flag set of its own."""
  config = validate.load_config_file(spec)
  validate.check_overrides(config, overrides)
  argv = ["launch.k8s", f"--config={spec}", *overrides]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True,
                                  sys_argv=argv)
  flag_values(argv)
  return flag_values.config


def main(argv):
  del argv
  if not _CONFIG.value:
    raise SystemExit("error: --config is required")
  import yaml
  try:
    config = load_config(_CONFIG.value, list(_OVERRIDE.value))
    validate.validate(config)
  except (validate.ConfigError, ValueError, flags.Error) as e:   # as dockyard.launch reports them
    raise SystemExit(f"error: {e}")
  opts = k8s.Options(
      config_spec=_CONFIG.value, name=_NAME.value or config.run.name.replace("_", "-"),
      namespace=_NAMESPACE.value, image=_IMAGE.value, sandbox_image=_SANDBOX_IMAGE.value,
      ray_kind=_RAY_KIND.value, node_cpus=_NODE_CPUS.value, node_memory=_NODE_MEMORY.value,
      sandbox_slots=_SANDBOX_SLOTS.value, sandbox_pod=_SANDBOX_POD.value,
      workdir_claim=_WORKDIR_CLAIM.value, repos_claim=_REPOS_CLAIM.value, overrides=tuple(_OVERRIDE.value))
  manifests = k8s.render(config, opts)
  if _CHECK.value:
    print("\n".join(k8s.check(manifests, _K8S_VERSION.value)))
    return
  class Dumper(yaml.SafeDumper):  # shared label dicts are written out, not as &anchors
    def ignore_aliases(self, data):
      return True
  yaml.dump_all(manifests, sys.stdout, Dumper=Dumper, sort_keys=False, width=120)


if __name__ == "__main__":
  app.run(main)

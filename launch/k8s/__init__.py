"""Kubernetes manifests for a config: a KubeRay RayJob (or RayCluster) of trainer + inference pods,
and the sandbox executor as a hardened Deployment + Service, a NetworkPolicy that denies its
egress, and PodDisruptionBudgets. `python -m launch.k8s` prints them (launch/k8s/__main__.py).

The Ray head is the first trainer node and the training command its driver; every Ray pod sets
DOCKYARD_FLEET_ROLE and advertises `fleet_<role>: 1` (dockyard/ray_utils.py). `check` validates
the manifests offline: the built-in kinds with kubernetes-validate's schemas, the Ray kinds with
the hand-written KubeRay subset in schemas/ray.io_v1.json (docs/deployment.md).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex

from dockyard import ray_utils
from dockyard.sandbox.isolation import Limits

SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")
SANDBOX_UID = 10001   # docker/ubuntu-swe.Dockerfile's user
RAY_VERSION = "2.60.0"  # setup.py's ray pin; the images carry it


@dataclasses.dataclass
class Options:
  """What the launcher flags choose; the config supplies the rest."""
  config_spec: str
  name: str
  namespace: str = "dockyard"
  image: str = "dockyard/trainer:latest"
  sandbox_image: str = "dockyard/ubuntu-swe:latest"
  ray_kind: str = "RayJob"           # RayJob | RayCluster
  node_cpus: int = 32                # per Ray pod
  node_memory: str = "256Gi"
  sandbox_slots: int = 4             # concurrent test runs per sandbox pod (its CPU request)
  sandbox_pod: str = "executor"      # executor | hardened (docs/deployment.md)
  workdir_claim: str = ""            # PersistentVolumeClaim for /workdir; '' : emptyDir (lost)
  repos_claim: str = ""              # PersistentVolumeClaim holding the task repos (read-only)
  overrides: tuple = ()              # extra --config.* flags for the training command


def _labels(opts: Options, component: str, role: str | None = None) -> dict:
  out = {"app.kubernetes.io/part-of": opts.name, "app.kubernetes.io/component": component}
  if role:
    out["dockyard/fleet-role"] = role
  return out


def _volume(name: str, claim: str, read_only: bool = False) -> dict:
  if claim:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}
  return {"name": name, "emptyDir": {}}


def _ray_pod(config, opts: Options, role: str, container: str) -> dict:
  gpus = int(config.cluster.accelerators_per_node)
  resources = {"cpu": str(opts.node_cpus), "memory": opts.node_memory}
  if gpus:
    resources["nvidia.com/gpu"] = str(gpus)
  return {
      "metadata": {"labels": _labels(opts, "ray", role)},
      "spec": {
          "containers": [{
              "name": container,
              "image": opts.image,
              "env": [{"name": ray_utils.FLEET_ROLE_ENV, "value": role}],
              "resources": {"requests": resources, "limits": dict(resources)},
              "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                               {"name": "workdir", "mountPath": "/workdir"}],
          }],
          # vLLM and NCCL need more shared memory than a container's 64 MiB default.
          "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                      _volume("workdir", opts.workdir_claim)],
      },
  }


def _start_params(role: str, head: bool = False) -> dict:
  # KubeRay passes `resources` to `ray start --resources=...` through a shell: the JSON is quoted.
  params = {"resources": '"' + json.dumps({ray_utils.fleet_resource(role): 1}).replace('"', '\\"') + '"'}
  if head:
    params["dashboard-host"] = "0.0.0.0"
  return params


def sandbox_service(opts: Options) -> str:
  return f"{opts.name}-sandbox"


def entrypoint(config, opts: Options) -> str:
  port = int(config.sandbox.port)
  url = f"http://{sandbox_service(opts)}.{opts.namespace}.svc:{port}"
  cmd = ["python", "-m", "dockyard.launch", f"--config={opts.config_spec}", f"--workdir=/workdir/{opts.name}",
         "--config.run.ray_address=auto", f'--config.env.code.sandbox_urls=("{url}",)', *opts.overrides]
  return "cd /opt/dockyard && " + shlex.join(cmd)


def ray_manifest(config, opts: Options) -> dict:
  cluster = config.cluster
  workers = []
  for role, count in (("trainer", cluster.trainer_nodes - 1), ("inference", cluster.inference_nodes)):
    if count > 0:
      workers.append({"groupName": role, "replicas": count, "minReplicas": count, "maxReplicas": count,
                      "rayStartParams": _start_params(role), "template": _ray_pod(config, opts, role, "ray-worker")})
  cluster_spec = {
      "rayVersion": RAY_VERSION,
      "headGroupSpec": {"rayStartParams": _start_params("trainer", head=True),
                        "template": _ray_pod(config, opts, "trainer", "ray-head")},
      "workerGroupSpecs": workers,
  }
  meta = {"name": opts.name, "namespace": opts.namespace, "labels": _labels(opts, "ray")}
  if opts.ray_kind == "RayCluster":
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": meta, "spec": cluster_spec}
  return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": meta, "spec": {
      "entrypoint": entrypoint(config, opts), "submissionMode": "K8sJobMode",
      "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 3600, "rayClusterSpec": cluster_spec}}


def _sandbox_security(opts: Options) -> tuple[dict, dict]:
  """(pod, container) securityContext. `hardened`: non-root, nothing added. `executor`: what the
  executor's isolation needs today (root in a user-namespaced pod, CAP_SYS_ADMIN for its mount
  namespace and overlayfs, AppArmor unconfined for mount, an unmasked /proc for bwrap), read from
  dockyard/sandbox/isolation.py; not run on a cluster."""
  if opts.sandbox_pod == "executor":
    pod = {"runAsUser": 0, "runAsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": True, "readOnlyRootFilesystem": True,
                 "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN", "SETUID", "SETGID", "CHOWN",
                                                            "DAC_OVERRIDE", "FOWNER", "KILL"]},
                 "appArmorProfile": {"type": "Unconfined"},
                 # bwrap mounts a fresh /proc; the kernel refuses it over the runtime's masked paths.
                 "procMount": "Unmasked"}
    return pod, container
  pod = {"runAsNonRoot": True, "runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID, "fsGroup": SANDBOX_UID,
         "seccompProfile": {"type": "RuntimeDefault"}}
  container = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
               "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
  return pod, container


def sandbox_manifests(config, opts: Options) -> list[dict]:
  sandbox = config.sandbox
  port, slots = int(sandbox.port), opts.sandbox_slots
  name, labels = sandbox_service(opts), _labels(opts, "sandbox", "sandbox")
  meta = {"name": name, "namespace": opts.namespace, "labels": labels}
  pod_security, container_security = _sandbox_security(opts)
  # A run may use its RLIMIT_AS plus two tmpfs (the tree's writes and /tmp), which count as memory.
  limits = Limits.from_config(sandbox)
  per_run_mi = limits.memory_mb + 2 * limits.disk_mb
  probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10}
  container = {
      "name": "executor",
      "image": opts.sandbox_image,
      "args": ["python", "-m", "dockyard.sandbox.server", "--host=0.0.0.0", f"--port={port}",
               f"--slots={slots}", f"--queue-size={int(sandbox.queue_size)}",
               "--repos-dir=/var/lib/dockyard/repos", "--cache-dir=/var/cache/dockyard"],
      "env": [{"name": ray_utils.FLEET_ROLE_ENV, "value": "sandbox"}, {"name": "HOME", "value": "/home/dockyard"}],
      "ports": [{"name": "http", "containerPort": port}],
      "readinessProbe": probe,
      "livenessProbe": dict(probe, failureThreshold=6),
      "resources": {
          "requests": {"cpu": str(slots), "memory": f"{slots * 1024}Mi", "ephemeral-storage": "10Gi"},
          "limits": {"cpu": str(slots), "memory": f"{slots * per_run_mi}Mi", "ephemeral-storage": "20Gi"},
      },
      "securityContext": container_security,
      # The root filesystem is read-only; these are the only writable places.
      "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": "/var/cache/dockyard"},
                       {"name": "home", "mountPath": "/home/dockyard"},
                       {"name": "repos", "mountPath": "/var/lib/dockyard/repos", "readOnly": bool(opts.repos_claim)}],
  }
  pod_spec = {"automountServiceAccountToken": False, "enableServiceLinks": False,
              "securityContext": pod_security, "containers": [container],
              "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}},
                          {"name": "home", "emptyDir": {}}, _volume("repos", opts.repos_claim, read_only=True)]}
  if opts.sandbox_pod == "executor":
    pod_spec["hostUsers"] = False   # container root is an unprivileged uid on the node
  deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
      "replicas": int(sandbox.num_executors), "selector": {"matchLabels": labels},
      "template": {"metadata": {"labels": labels}, "spec": pod_spec}}}
  service = {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
      "selector": labels, "ports": [{"name": "http", "port": port, "targetPort": "http"}]}}
  # Egress: none at all (an empty list denies every destination, DNS included). Ingress: the Ray
  # pods of this run, on the executor's port.
  policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta, "spec": {
      "podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress", "Egress"], "egress": [],
      "ingress": [{"from": [{"podSelector": {"matchLabels": _labels(opts, "ray")}}],
                   "ports": [{"protocol": "TCP", "port": port}]}]}}
  budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta,
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}}
  return [deployment, service, policy, budget]


def ray_budget(opts: Options) -> dict:
  """Losing any Ray pod ends the run (no elastic training): voluntary evictions wait for it."""
  labels = _labels(opts, "ray")
  return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
          "metadata": {"name": f"{opts.name}-ray", "namespace": opts.namespace, "labels": labels},
          "spec": {"maxUnavailable": 0, "selector": {"matchLabels": labels}}}


def render(config, opts: Options) -> list[dict]:
  return [ray_manifest(config, opts), ray_budget(opts), *sandbox_manifests(config, opts)]


def check(manifests: list[dict], k8s_version: str) -> list[str]:
  """Validates offline; returns one line per manifest, raises on the first invalid one."""
  import kubernetes_validate
  lines = []
  for m in manifests:
    where = f"{m['kind']}/{m['metadata']['name']}"
    if m["apiVersion"] == "ray.io/v1":
      _ray_validator(m["kind"], k8s_version).validate(m)
      lines.append(f"{where}: valid (schemas/ray.io_v1.json, pod templates: Kubernetes {k8s_version})")
    else:
      try:
        version = kubernetes_validate.validate(m, k8s_version, strict=True)
      except kubernetes_validate.ValidationError as e:
        raise ValueError(f"{where}: {e.message} at {'.'.join(map(str, e.path))}") from None
      lines.append(f"{where}: valid (Kubernetes {version}, strict)")
  return lines


def _ray_validator(kind: str, k8s_version: str):
  import jsonschema
  import kubernetes_validate
  import referencing
  with open(os.path.join(SCHEMAS, "ray.io_v1.json")) as f:
    ray_schema = json.load(f)
  k8s_dir = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema",
                         f"v{k8s_version}.0-local-strict" if k8s_version.count(".") == 1 else f"v{k8s_version}-local-strict")
  with open(os.path.join(k8s_dir, "_definitions.json")) as f:
    k8s_defs = json.load(f)
  registry = referencing.Registry().with_resources([
      (ray_schema["$id"], referencing.Resource.from_contents(ray_schema)),
      ("https://kubernetes.io/api/_definitions.json", referencing.Resource.from_contents(k8s_defs))])
  schema = {"$schema": ray_schema["$schema"], "$ref": f"{ray_schema['$id']}#/$defs/{kind}"}
  return jsonschema.Draft202012Validator(schema, registry=registry)

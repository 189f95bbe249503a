"""The launch files (issue 20 items 3-5), checked offline: shellcheck on the shell scripts, the
Slurm script's dry run, the Kubernetes manifests against kubernetes-validate's schemas and the
shipped KubeRay subset, the sandbox pod's hardening, hadolint on the Dockerfiles. No Docker, no
cluster: what those would add is listed in docs/deployment.md."""
import glob
import os
import subprocess
import sys

import jsonschema
import pytest
import yaml

import launch.k8s as k8s
from dockyard import ray_utils, validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
K8S_VERSION = "1.33"   # the oldest minor still supported upstream when this was written
SHELL_SCRIPTS = ["launch/slurm/ray.sub", "run.sh", "test.sh", *sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "scripts", "*.sh")))]


def _tool(name):
  return os.path.join(BIN, name)


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shellcheck(script):
  r = subprocess.run([_tool("shellcheck"), "--shell=bash", "--severity=style", script], cwd=ROOT,
                     capture_output=True, text=True)
  assert r.returncode == 0, r.stdout + r.stderr


def _dry_run(*args):
  r = subprocess.run(["bash", "launch/slurm/ray.sub", "--dry_run", *args], cwd=ROOT, capture_output=True,
                     text=True, env=dict(os.environ, PWD="/shared/run"))
  assert r.returncode == 0, r.stderr
  return r.stdout.splitlines()


def test_slurm_dry_run_roles_per_node():
  lines = _dry_run("--nodelist=n0,n1,n2,n3,n4", "--trainer_nodes=2", "--inference_nodes=2",
                   "--", "--config.grpo.num_prompts_per_step=32")
  assert len(lines) == 6
  head, *workers, driver = lines
  assert head.startswith("srun --nodes=1 --ntasks=1 -w n0 ")   # the head first
  assert "python -m dockyard.ray_node -- --head --node-ip-address=n0 --port=6379" in head and head.endswith(" &")
  roles = {"n0": "trainer", "n1": "trainer", "n2": "inference", "n3": "inference", "n4": "sandbox"}
  for node, line in zip(["n1", "n2", "n3", "n4"], workers):
    role = roles[node]
    assert f" -w {node} " in line and f"--export=ALL,{ray_utils.FLEET_ROLE_ENV}={role} " in line, line
    if role == "sandbox":
      assert "--container-image=dockyard/ubuntu-swe:latest" in line
      assert "python -m dockyard.sandbox.server --host=0.0.0.0 --port=9090" in line
    else:
      assert "--container-image=dockyard/trainer:latest" in line
      # The bootstrap reads the role exported above and adds its resource (tests/launch/test_fleet_roles.py).
      assert "python -m dockyard.ray_node -- --address=n0:6379" in line
  assert f"--export=ALL,{ray_utils.FLEET_ROLE_ENV}=trainer " in head
  assert " -w n0 --overlap " in driver and not driver.endswith("&")
  assert "python -m dockyard.launch --config=configs/swe.py:full" in driver
  assert "--config.run.ray_address=n0:6379" in driver
  assert "'--config.env.code.sandbox_urls=(\"http://n4:9090\",)' --config.grpo.num_prompts_per_step=32" in driver


def test_slurm_dry_run_without_sandbox_nodes_shares_the_head():
  lines = _dry_run("--nodelist=a,b,c,d")   # configs/swe.py:full's 3 trainer + 1 inference nodes
  assert [line.split(" -w ")[1].split()[0] for line in lines] == ["a", "b", "c", "d", "a", "a"]
  assert "DOCKYARD_FLEET_ROLE=sandbox" in lines[4] and "--overlap" in lines[4]
  assert "sandbox_urls=(\"http://localhost:9090\",)" in lines[5]


def test_slurm_refuses_roles_that_do_not_fit():
  r = subprocess.run(["bash", "launch/slurm/ray.sub", "--dry_run", "--nodelist=a,b", "--trainer_nodes=2",
                      "--inference_nodes=1"], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 2 and "do not fit 2 nodes" in r.stderr


def _render(*flags):
  r = subprocess.run([sys.executable, "-m", "launch.k8s", "--config=configs/swe.py:full", *flags], cwd=ROOT,
                     capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  return {m["kind"] + ("-ray" if m["metadata"]["name"].endswith("-ray") else ""): m
          for m in yaml.safe_load_all(r.stdout)}


@pytest.fixture(scope="module")
def manifests():
  return _render()


@pytest.fixture(scope="module")
def hardened():
  return _render("--sandbox_pod=hardened")


def test_k8s_manifests_validate_offline(manifests):
  assert sorted(manifests) == ["Deployment", "NetworkPolicy", "PodDisruptionBudget", "PodDisruptionBudget-ray",
                               "RayJob", "Service"]
  lines = k8s.check(list(manifests.values()), K8S_VERSION)
  assert all("valid" in line for line in lines) and len(lines) == 6


def test_rayjob_matches_the_config(manifests):
  job = manifests["RayJob"]
  config = validate.load_config_file("configs/swe.py:full")
  cluster = job["spec"]["rayClusterSpec"]
  head = cluster["headGroupSpec"]
  assert head["rayStartParams"]["resources"] == '"{\\"fleet_trainer\\": 1}"'
  groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
  assert groups["trainer"]["replicas"] == config.cluster.trainer_nodes - 1
  assert groups["inference"]["replicas"] == config.cluster.inference_nodes
  for role, pod in [("trainer", head["template"]), ("inference", groups["inference"]["template"])]:
    container = pod["spec"]["containers"][0]
    assert {"name": ray_utils.FLEET_ROLE_ENV, "value": role} in container["env"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(config.cluster.accelerators_per_node)
  assert "--config.run.ray_address=auto" in job["spec"]["entrypoint"]
  assert "http://swe-full-sandbox.dockyard.svc:9090" in job["spec"]["entrypoint"]


def test_ray_schema_rejects_what_kuberay_would(manifests):
  job = manifests["RayJob"]
  validator = k8s._ray_validator("RayJob", K8S_VERSION)
  bad = yaml.safe_load(yaml.safe_dump(job))
  bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 2         # a misspelt field
  with pytest.raises(jsonschema.ValidationError):
    validator.validate(bad)
  bad = yaml.safe_load(yaml.safe_dump(job))
  bad["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imag"] = "x"  # in the pod
  with pytest.raises(jsonschema.ValidationError):
    validator.validate(bad)


def test_default_sandbox_pod_is_root_only_in_its_user_namespace(manifests):
  # The default runs today's executor (root holder, unshare --mount, overlayfs, bwrap): root in
  # a user-namespaced pod, every capability dropped but the ones its isolation uses.
  pod = manifests["Deployment"]["spec"]["template"]["spec"]
  assert pod["hostUsers"] is False and pod["automountServiceAccountToken"] is False
  assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
  (container,) = pod["containers"]
  sc = container["securityContext"]
  assert sc["capabilities"]["drop"] == ["ALL"] and "SYS_ADMIN" in sc["capabilities"]["add"]
  assert sc["readOnlyRootFilesystem"] is True
  assert k8s.check(list(manifests.values()), K8S_VERSION)


def test_sandbox_pod_can_be_hardened(hardened):
  manifests = hardened
  pod = manifests["Deployment"]["spec"]["template"]["spec"]
  assert "hostUsers" not in pod
  assert pod["securityContext"]["runAsNonRoot"] is True
  assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
  assert pod["automountServiceAccountToken"] is False
  (container,) = pod["containers"]
  sc = container["securityContext"]
  assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
  assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
  assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
  requests, limits = container["resources"]["requests"], container["resources"]["limits"]
  for key in ("cpu", "memory", "ephemeral-storage"):
    assert key in requests and key in limits
  assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
  assert {"name": ray_utils.FLEET_ROLE_ENV, "value": "sandbox"} in container["env"]
  service = manifests["Service"]
  assert service["spec"]["selector"] == manifests["Deployment"]["spec"]["selector"]["matchLabels"]
  assert service["spec"]["ports"][0]["port"] == 9090


def test_network_policy_denies_sandbox_egress(manifests):
  policy = manifests["NetworkPolicy"]["spec"]
  assert policy["podSelector"]["matchLabels"] == manifests["Deployment"]["spec"]["selector"]["matchLabels"]
  assert "Egress" in policy["policyTypes"] and policy["egress"] == []
  budget = manifests["PodDisruptionBudget"]["spec"]
  assert budget["selector"] == manifests["Deployment"]["spec"]["selector"]


@pytest.mark.parametrize("dockerfile", ["docker/ubuntu-swe.Dockerfile", "docker/trainer.Dockerfile"])
def test_hadolint(dockerfile):
  # style is the lowest severity: any finding fails; ignored rules carry their reason inline.
  r = subprocess.run([_tool("hadolint"), "--no-color", "--failure-threshold=style", dockerfile], cwd=ROOT,
                     capture_output=True, text=True)
  assert r.returncode == 0, r.stdout + r.stderr
  with open(os.path.join(ROOT, dockerfile)) as f:
    lines = f.read().splitlines()
  last_run = max(i for i, line in enumerate(lines) if line.startswith("RUN "))
  assert "import " in " ".join(lines[last_run:]), "the image must end in an import smoke check"


def test_overrides_reach_the_manifests_and_typos_name_their_key():
  # Parsed as dockyard.launch parses them (ml_collections' config_flags), so the manifests see them.
  rendered = _render("--override=--config.sandbox.num_executors=3")
  assert rendered["Deployment"]["spec"]["replicas"] == 3
  assert "--config.sandbox.num_executors=3" in rendered["RayJob"]["spec"]["entrypoint"]
  r = subprocess.run([sys.executable, "-m", "launch.k8s", "--config=configs/swe.py:full",
                      "--override=--config.sandbox.num_executor=3"], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode != 0 and "config.sandbox.num_executor: unknown key" in r.stderr

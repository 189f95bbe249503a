"""Fixtures for the sandbox tests: a synthetic repo under a temp repos_dir, executors (in-process
and as a real server subprocess), and a check that nothing a run started is left behind."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import repo_factory  # noqa: E402

from dockyard.sandbox.executor import Executor, Limits  # noqa: E402
from dockyard.sandbox.isolation import SANDBOX_UID  # noqa: E402
from dockyard.sandbox.local import start_local_executor  # noqa: E402

# Tight limits so attacks end fast; ample for the tiny repo's tests.
ADVERSARIAL_LIMITS = dict(timeout_s=6.0, cpu_time_s=3, memory_mb=1024, max_processes=64,
                          max_file_size_mb=64, max_open_files=256, max_output_bytes=64 << 10,
                          disk_mb=128)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
  root = tmp_path_factory.mktemp("sandbox")
  repos = root / "repos"
  repos.mkdir()
  base = repo_factory.make_repo(str(repos))
  evil_base = repo_factory.make_repo(str(repos), repo_factory.EVIL_REPO,
                                     extra=repo_factory.EVIL_CONFTEST)
  return dict(repos=str(repos), cache=str(root / "cache"), base=base, evil_base=evil_base,
              root=str(root))


@pytest.fixture(scope="session")
def executor(workspace):
  return Executor(repos_dir=workspace["repos"], cache_dir=workspace["cache"], slots=2,
                  limits=Limits(**ADVERSARIAL_LIMITS))


@pytest.fixture(scope="session")
def server(workspace):
  handle = start_local_executor(slots=2, repos_dir=workspace["repos"],
                                cache_dir=workspace["cache"], limits=ADVERSARIAL_LIMITS,
                                log_path=os.path.join(workspace["root"], "server.log"))
  yield handle
  handle.kill()


def sandbox_processes() -> list[str]:
  """Live processes of the sandbox uid (none must outlive a verdict). Zombies are dead and
  skipped: bwrap's pid-1 exits just after the outer bwrap, so host init reaps it a moment later."""
  out = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      with open(f"/proc/{pid}/status") as f:
        status = f.read()
    except OSError:
      continue
    uid_line = next((l for l in status.splitlines() if l.startswith("Uid:")), "")
    state = next((l for l in status.splitlines() if l.startswith("State:")), "")
    if str(SANDBOX_UID) in uid_line.split()[1:2] and state.split()[1:2] != ["Z"]:
      name = next((l for l in status.splitlines() if l.startswith("Name:")), "")
      out.append(f"{pid} {name}")
  return out

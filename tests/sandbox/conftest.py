"""Fixtures for the sandbox tests: the synthetic repo under a temp repos_dir, executors (in-process
and as a real server subprocess) with tight limits so attacks end fast."""
from __future__ import annotations

import os

import pytest

from dockyard.sandbox import synthetic as rf
from dockyard.sandbox.executor import Executor, Limits
from dockyard.sandbox.local import start_local_executor

# Tight limits so attacks end fast; ample for the tiny repo's tests.
ADVERSARIAL_LIMITS = dict(timeout_s=6.0, cpu_time_s=3, memory_mb=1024, max_processes=64,
                          max_file_size_mb=64, max_open_files=256, max_output_bytes=64 << 10,
                          disk_mb=128)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
  root = tmp_path_factory.mktemp("sandbox")
  repos = root / "repos"
  repos.mkdir()
  base = rf.make_repo(str(repos))
  evil_base = rf.make_repo(str(repos), rf.EVIL_REPO,
                                     extra=rf.EVIL_CONFTEST)
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

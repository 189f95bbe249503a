"""Fixtures for the SWE task set tests: the committed data, and its repos made from scratch.

`swe_repos` fetches the pinned sdists (cached under ~/.cache/dockyard/sdists after the first
fetch; verified by sha256 every time) and creates every package repo and the tiny tasks' base
commits in a fresh directory, checking every hash against the committed records.
"""
import os

import pytest

from dockyard.data import repos, swe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data", "swe")
MANIFEST = os.path.join(DATA, "manifest.json")
TINY = os.path.join(DATA, "tiny", "train.jsonl")


@pytest.fixture(scope="session")
def tiny_tasks():
  return swe.load_tasks(TINY)


@pytest.fixture(scope="session")
def swe_repos(tmp_path_factory, tiny_tasks):
  """repos_dir holding every package repo + the tiny tasks' base commits, made from scratch."""
  repos_dir = str(tmp_path_factory.mktemp("repos"))
  paths = repos.ensure_repos(MANIFEST, [t.to_dict() for t in tiny_tasks], repos_dir)
  return repos_dir, paths


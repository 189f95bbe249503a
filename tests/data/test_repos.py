"""The task repos made from scratch: sha256-checked sdists, reproducible commits, unshadowed packages."""
import json
import os

import pytest

from dockyard.data import direct_runner, repos

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data", "swe")
MANIFEST = os.path.join(DATA, "manifest.json")


def test_repos_reproduce_the_recorded_commits(swe_repos, tiny_tasks):
  repos_dir, paths = swe_repos
  with open(MANIFEST) as f:
    pristine = json.load(f)["pristine_commits"]
  for repo, path in paths.items():
    assert path.endswith(repos.repo_dirname(repo))
    assert repos.git(path, "rev-parse", "pristine^{commit}").strip() == pristine[repo]
  for t in tiny_tasks:
    path = paths[t.repo]
    # The base commit is a child of the pristine commit, and the gold patch is exactly the difference.
    assert repos.git(path, "rev-parse", f"{t.base_commit}^").strip() == pristine[t.repo]
    diff = repos.git(path, "diff", "--no-color", "--no-ext-diff", "--no-renames", "--full-index",
                     t.base_commit, pristine[t.repo])
    assert diff == t.patch
  # Idempotent: a second call finds everything in place and checks it again.
  assert repos.ensure_repos(MANIFEST, [t.to_dict() for t in tiny_tasks], repos_dir) == paths


def test_making_the_repos_shows_a_bar_of_packages_then_tasks(swe_repos, tiny_tasks, capsys):
  repos_dir, paths = swe_repos
  capsys.readouterr()
  repos.ensure_repos(MANIFEST, [t.to_dict() for t in tiny_tasks], repos_dir, progress=True)
  total = len(repos.load_packages(MANIFEST)) + len(tiny_tasks)
  err = capsys.readouterr().err
  assert "task repos: 100%" in err and f" {total}/{total} " in err


def test_package_under_test_is_not_shadowed(swe_repos, tmp_path):
  _, paths = swe_repos
  for pkg in repos.load_packages(MANIFEST):
    tree = repos.export_tree(paths[pkg.repo], "pristine", str(tmp_path / pkg.repo_dirname))
    assert direct_runner.check_not_shadowed(tree, pkg.module).startswith(tree)


def test_mismatches_are_errors(swe_repos, tiny_tasks):
  repos_dir, _ = swe_repos
  pkgs = repos.load_packages(MANIFEST)
  with pytest.raises(RuntimeError, match="pristine commit .* differs from the manifest"):
    repos.ensure_repos(pkgs[:1], [], repos_dir, pristine_commits={pkgs[0].repo: "0" * 40})
  task = dict(tiny_tasks[0].to_dict(), base_commit="f" * 40, instance_id="bogus-task")
  with pytest.raises(RuntimeError, match="rebuilt base commit .* != recorded"):
    repos.ensure_repos(pkgs, [task], repos_dir)
  with pytest.raises(ValueError, match="not in the manifest"):
    repos.ensure_repos(pkgs[:0], [dict(task, repo="nobody/nothing")], repos_dir)
  with pytest.raises(ValueError, match="repo must be 'owner/name'"):
    repos.repo_dirname("no-slash")


def test_sdist_hash_is_enforced(tmp_path):
  """A cached sdist is used only if its sha256 matches the pin; a wrong pin makes pip refuse the download."""
  import dataclasses
  import shutil
  pkg = next(p for p in repos.load_packages(MANIFEST) if p.name == "inflection")
  good = repos.fetch_sdist(pkg)                      # cached (verified) or downloaded
  assert repos.sha256_file(good) == pkg.sha256
  shutil.copy(good, tmp_path)
  assert repos.fetch_sdist(pkg, str(tmp_path)) == str(tmp_path / "inflection-0.5.1.tar.gz")
  wrong = dataclasses.replace(pkg, sha256="0" * 64)
  with pytest.raises(RuntimeError, match="DO NOT MATCH THE HASHES"):
    repos.fetch_sdist(wrong, str(tmp_path))

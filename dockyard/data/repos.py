"""Pinned source distributions -> deterministic local git repositories (the sandbox's `repo`s).

`ensure_repos(manifest, repos_dir)` fetches each package's sdist with `pip download --no-binary
:all: --no-deps` (hash-pinned), checks its sha256, unpacks it into `<repos_dir>/<owner>__<name>`,
commits it as the pristine tree, then re-creates every task's buggy commit (the pristine tree with
the task's gold patch applied in reverse; a child of the pristine commit, tagged with the
instance id). Author, committer, dates and messages are fixed, so every hash matches the committed
task records on any machine; a mismatch is an error.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Iterable, Mapping, Sequence

from dockyard import console

GIT_DATE = "2025-01-01T00:00:00+0000"
GIT_IDENTITY = dict(GIT_AUTHOR_NAME="dockyard", GIT_AUTHOR_EMAIL="dockyard@localhost",
                    GIT_COMMITTER_NAME="dockyard", GIT_COMMITTER_EMAIL="dockyard@localhost",
                    GIT_AUTHOR_DATE=GIT_DATE, GIT_COMMITTER_DATE=GIT_DATE)
PRISTINE_TAG = "pristine"


@dataclasses.dataclass(frozen=True)
class Package:
  name: str             # PyPI name
  version: str
  sha256: str           # of the sdist
  repo: str             # "owner/name"
  license: str
  module: str           # the importable package under test (checked not shadowed by site-packages)
  split: str            # train | validation | test (by package: test packages never seen in training)
  test_globs: tuple[str, ...] = ("tests/test_*.py",)
  max_kept: int = 0     # per-package cap on kept tasks (0: the builder's --max_kept); for slow suites

  @property
  def repo_dirname(self) -> str:
    return repo_dirname(self.repo)


def repo_dirname(repo: str) -> str:
  if repo.count("/") != 1 or not all(repo.split("/")):
    raise ValueError(f"repo must be 'owner/name', got {repo!r}")
  return repo.replace("/", "__")


def default_repos_dir() -> str:
  return os.environ.get("DOCKYARD_REPOS_DIR", os.path.expanduser("~/.cache/dockyard/repos"))


def default_sdist_dir() -> str:
  root = os.environ.get("DOCKYARD_CACHE", os.path.expanduser("~/.cache/dockyard"))
  return os.path.join(root, "sdists")


def load_packages(path: str) -> list[Package]:
  """Reads the pinned package list (`packages` of data/swe/manifest.json or data/swe/packages.json)."""
  with open(path) as f:
    raw = json.load(f)
  entries = raw["packages"] if isinstance(raw, dict) else raw
  out = []
  for e in entries:
    missing = {"name", "version", "sha256", "repo", "license", "module", "split"} - set(e)
    if missing:
      raise ValueError(f"{path}: package entry {e.get('name', e)!r} lacks {sorted(missing)}")
    if e["split"] not in ("train", "validation", "test"):
      raise ValueError(f"{path}: package {e['name']!r} has split {e['split']!r}; "
                       "expected train | validation | test")
    out.append(Package(**{k: tuple(v) if k == "test_globs" else v for k, v in e.items()
                          if k in Package.__dataclass_fields__}))
  return out


def sha256_file(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def fetch_sdist(pkg: Package, sdist_dir: str | None = None) -> str:
  """The verified sdist path; downloads it with pip (hash-pinned) unless a verified copy is cached."""
  sdist_dir = sdist_dir or default_sdist_dir()
  os.makedirs(sdist_dir, exist_ok=True)
  for fname in os.listdir(sdist_dir):
    path = os.path.join(sdist_dir, fname)
    if fname.endswith((".tar.gz", ".zip")) and _sdist_matches(fname, pkg) and sha256_file(path) == pkg.sha256:
      return path
  with tempfile.TemporaryDirectory() as tmp:
    req = os.path.join(tmp, "req.txt")
    with open(req, "w") as f:
      f.write(f"{pkg.name}=={pkg.version} --hash=sha256:{pkg.sha256}\n")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                           "--require-hashes", "--disable-pip-version-check", "-q", "-r", req, "-d", tmp],
                          capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f"pip download {pkg.name}=={pkg.version} failed:\n{proc.stderr[-2000:]}")
    got = [f for f in os.listdir(tmp) if f != "req.txt"]
    if len(got) != 1:
      raise RuntimeError(f"pip download {pkg.name}=={pkg.version} produced {got}, expected one sdist")
    digest = sha256_file(os.path.join(tmp, got[0]))
    if digest != pkg.sha256:
      raise RuntimeError(f"sdist {got[0]} has sha256 {digest}, the manifest pins {pkg.sha256}")
    dest = os.path.join(sdist_dir, got[0])
    shutil.move(os.path.join(tmp, got[0]), dest)
    return dest


def _sdist_matches(fname: str, pkg: Package) -> bool:
  norm = lambda s: s.lower().replace("-", "_").replace(".", "_")
  return norm(fname).startswith(norm(f"{pkg.name}-{pkg.version}"))


def git(repo_dir: str, *args: str, input: str | None = None, env: Mapping[str, str] | None = None) -> str:
  """Runs git with a config independent of the user's (no global/system config, fixed identity)."""
  full_env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
  full_env.update(GIT_IDENTITY, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, **(env or {}))
  cmd = ["git", "-c", "core.autocrlf=false", "-c", "core.fileMode=true", "-c", "commit.gpgSign=false",
         "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "core.quotePath=true", *args]
  proc = subprocess.run(cmd, cwd=repo_dir, input=input, capture_output=True, text=True, env=full_env)
  if proc.returncode:
    raise RuntimeError(f"git {' '.join(args)} failed in {repo_dir}: {proc.stderr.strip()[-2000:]}")
  return proc.stdout


def _unpack(sdist: str, dest: str) -> None:
  with tarfile.open(sdist) as tar:
    members = tar.getmembers()
    tops = {m.name.split("/", 1)[0] for m in members}
    if len(tops) != 1:
      raise RuntimeError(f"{sdist}: expected one top-level directory, got {sorted(tops)}")
    tmp = tempfile.mkdtemp(dir=os.path.dirname(dest))
    try:
      tar.extractall(tmp, filter="data")
      os.rename(os.path.join(tmp, tops.pop()), dest)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)


def _rev(repo_dir: str, ref: str) -> str | None:
  try:
    return git(repo_dir, "rev-parse", "-q", "--verify", ref + "^{commit}").strip()
  except RuntimeError:
    return None


def ensure_pristine(pkg: Package, repos_dir: str, sdist_dir: str | None = None) -> tuple[str, str]:
  """(repo path, pristine commit): the package's sdist committed once, deterministically."""
  path = os.path.join(repos_dir, pkg.repo_dirname)
  if os.path.isdir(os.path.join(path, ".git")):
    commit = _rev(path, PRISTINE_TAG)
    if commit:
      return path, commit
    shutil.rmtree(path)    # a half-made repo from an interrupted run
  elif os.path.exists(path):
    raise RuntimeError(f"{path} exists but is not a git repository; remove it")
  os.makedirs(repos_dir, exist_ok=True)
  sdist = fetch_sdist(pkg, sdist_dir)
  _unpack(sdist, path)
  git(path, "init", "-q", "-b", "main")
  git(path, "add", "-A", "-f", ".")
  git(path, "commit", "-q", "--no-verify", "-m", f"{pkg.name} {pkg.version} (sdist sha256 {pkg.sha256})")
  git(path, "tag", PRISTINE_TAG)
  return path, _rev(path, "HEAD")


def commit_tree_with(repo_dir: str, parent: str, files: Mapping[str, str], message: str) -> str:
  """A child commit of `parent` whose tree replaces `files` (path -> text); the work tree is untouched."""
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(GIT_INDEX_FILE=os.path.join(tmp, "index"))
    git(repo_dir, "read-tree", parent, env=env)
    for rel, text in files.items():
      mode = git(repo_dir, "ls-tree", parent, "--", rel).split()[0]
      blob = git(repo_dir, "hash-object", "-w", "--stdin", input=text).strip()
      git(repo_dir, "update-index", "--cacheinfo", f"{mode},{blob},{rel}", env=env)
    tree = git(repo_dir, "write-tree", env=env).strip()
  return git(repo_dir, "commit-tree", tree, "-p", parent, "-m", message).strip()


def commit_reverse_patch(repo_dir: str, parent: str, patch: str, message: str) -> str:
  """A child commit of `parent` with `patch` applied in reverse (the buggy tree of a task)."""
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(GIT_INDEX_FILE=os.path.join(tmp, "index"))
    git(repo_dir, "read-tree", parent, env=env)
    git(repo_dir, "apply", "--cached", "-R", "-", input=patch, env=env)
    tree = git(repo_dir, "write-tree", env=env).strip()
  return git(repo_dir, "commit-tree", tree, "-p", parent, "-m", message).strip()


def task_message(instance_id: str) -> str:
  return f"{instance_id}: buggy tree (its gold patch restores the parent)"


def export_tree(repo_dir: str, commit: str, dest: str) -> str:
  """Writes the tree of `commit` (alone, no history) to `dest`."""
  os.makedirs(dest, exist_ok=True)
  archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=repo_dir, capture_output=True,
                           check=True).stdout
  with tempfile.NamedTemporaryFile(suffix=".tar") as f:
    f.write(archive)
    f.flush()
    with tarfile.open(f.name) as tar:
      tar.extractall(dest, filter="data")
  return dest


def ensure_repos(manifest: str | Sequence[Package], tasks: Iterable[Mapping] = (),
                 repos_dir: str | None = None, sdist_dir: str | None = None,
                 pristine_commits: Mapping[str, str] | None = None, progress: bool = False) -> dict[str, str]:
  """Creates (or checks) every package repo and every task's base commit. Returns repo -> path.
  A task whose repo is not in the manifest (imported, mined) must find its repository under
  `repos_dir` already, with its base_commit; it is checked, not built.

  `manifest` is a path to data/swe/manifest.json (its packages and pristine commits are used) or a
  list of `Package`s. Every task's `base_commit` must come out identical, else RuntimeError.
  `progress`: a bar on the terminal counting packages, then tasks (`console.bar`).
  """
  repos_dir = repos_dir or default_repos_dir()
  if isinstance(manifest, str):
    with open(manifest) as f:
      pristine_commits = dict(json.load(f).get("pristine_commits", {}), **(pristine_commits or {}))
    packages = load_packages(manifest)
  else:
    packages = list(manifest)
  by_repo = {p.repo: p for p in packages}
  tasks = list(tasks)
  paths = {}
  bar = console.bar(len(packages) + len(tasks), "task repos", enabled=progress)
  for pkg in packages:
    if bar is not None:
      bar.set_postfix_str(pkg.name)
    path, commit = ensure_pristine(pkg, repos_dir, sdist_dir)
    want = (pristine_commits or {}).get(pkg.repo)
    if want and want != commit:
      raise RuntimeError(f"{pkg.repo}: pristine commit {commit} differs from the manifest's {want}; "
                         f"the repo at {path} was not made by this code (remove it) or git differs")
    paths[pkg.repo] = path
    if bar is not None:
      bar.update(1)
  try:
    for task in tasks:
      _ensure_task_commit(paths, by_repo, task, repos_dir)
      if bar is not None:
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()
  return paths


def _ensure_task_commit(paths: Mapping[str, str], by_repo: Mapping[str, Package], task: Mapping,
                        repos_dir: str) -> None:
  if task["repo"] not in by_repo:
    # Not one of ours (imported or mined tasks): the repository is the user's to provide.
    path = os.path.join(repos_dir, repo_dirname(task["repo"]))
    if not os.path.isdir(path):
      raise ValueError(f"task {task['instance_id']}: repo {task['repo']!r} is not in the manifest "
                       f"and there is no git repository at {path} (clone it there)")
    if _rev(path, task["base_commit"]) is None:
      raise ValueError(f"task {task['instance_id']}: base_commit {task['base_commit']} is not a "
                       f"commit of {path}")
    return
  path = paths[task["repo"]]
  tag = f"refs/tags/{task['instance_id']}"
  if _rev(path, tag) == task["base_commit"]:
    return
  commit = commit_reverse_patch(path, _rev(path, PRISTINE_TAG), task["patch"], task_message(task["instance_id"]))
  if commit != task["base_commit"]:
    raise RuntimeError(f"task {task['instance_id']}: rebuilt base commit {commit} != recorded "
                       f"{task['base_commit']}")
  git(path, "update-ref", tag, commit)

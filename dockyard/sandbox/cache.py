"""Read-only checkouts, one per (repo, base_commit), prepared once and shared by every run.

`repo` "owner/name" is the local git repository `<repos_dir>/owner__name` (made by the task-set
builder). Its tree at base_commit is exported (through a scratch index, so `export-ignore`
attributes cannot drop files) into `<cache_dir>/trees/owner__name/<sha>/tree`, together with a
fresh single-commit `.git`: runs get `git apply --3way` and `git checkout` without any history
past base_commit. Files are made world-writable because they are only ever the lower layer of a
run's overlay (the sandbox user writes its copy-up, never this tree); the cache root is 0700.
"""
from __future__ import annotations

import asyncio
import fcntl
import os
import re
import shutil
import subprocess
import tempfile

DEFAULT_REPOS_DIR = os.path.join("~", ".cache", "dockyard", "repos")
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "dockyard", "sandbox")

# A fixed identity and date, so the single-commit repo is the same on every executor.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "dockyard", "GIT_AUTHOR_EMAIL": "sandbox@dockyard",
    "GIT_COMMITTER_NAME": "dockyard", "GIT_COMMITTER_EMAIL": "sandbox@dockyard",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0",
}


_FULL_SHA = re.compile(r"[0-9a-f]{40}")


class RepoError(RuntimeError):
  """The task's repository or base_commit cannot be found or exported."""


def resolve_repos_dir(repos_dir: str | None = None) -> str:
  return os.path.expanduser(repos_dir or os.environ.get("DOCKYARD_REPOS_DIR") or DEFAULT_REPOS_DIR)


def _git(*args: str, cwd: str | None = None, env: dict | None = None, **kw) -> str:
  full_env = dict(os.environ, **_GIT_ENV, **(env or {}))
  proc = subprocess.run(["git", *args], cwd=cwd, env=full_env, capture_output=True, text=True, **kw)
  if proc.returncode:
    raise RepoError(f"git {' '.join(args[:3])} failed: {proc.stderr.strip()[-500:]}")
  return proc.stdout


class RepoCache:

  def __init__(self, repos_dir: str | None = None, cache_dir: str | None = None):
    self.repos_dir = resolve_repos_dir(repos_dir)
    self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR))
    if any(c in self.cache_dir for c in ",:"):
      raise ValueError(f"cache_dir {self.cache_dir!r}: ',' and ':' cannot appear in an overlay path")
    os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
    os.chmod(self.cache_dir, 0o700)
    self._locks: dict[str, asyncio.Lock] = {}

  def repo_path(self, repo: str) -> str:
    path = os.path.join(self.repos_dir, repo.replace("/", "__"))
    if not os.path.isdir(path):
      raise RepoError(f"repo {repo!r}: no git repository at {path}")
    return path

  async def tree(self, repo: str, base_commit: str) -> str:
    """The prepared read-only tree for (repo, base_commit); builds it on first use."""
    key = f"{repo}@{base_commit}"
    lock = self._locks.setdefault(key, asyncio.Lock())
    async with lock:
      return await asyncio.to_thread(self._tree_sync, repo, base_commit)

  def _tree_sync(self, repo: str, base_commit: str) -> str:
    src = self.repo_path(repo)
    if _FULL_SHA.fullmatch(base_commit):  # already built for this very commit: no git run needed
      tree = os.path.join(self.cache_dir, "trees", repo.replace("/", "__"), base_commit, "tree")
      if os.path.exists(os.path.join(os.path.dirname(tree), "ready")):
        return tree
    try:
      sha = _git("rev-parse", "--verify", "--quiet", f"{base_commit}^{{commit}}", cwd=src).strip()
    except RepoError:
      raise RepoError(f"base_commit {base_commit!r}: not a commit in {src}") from None
    final = os.path.join(self.cache_dir, "trees", repo.replace("/", "__"), sha)
    tree = os.path.join(final, "tree")
    if os.path.exists(os.path.join(final, "ready")):
      return tree
    os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
    # A file lock: several executors on one node may share the cache.
    with open(final + ".lock", "w") as lock_file:
      fcntl.flock(lock_file, fcntl.LOCK_EX)
      if os.path.exists(os.path.join(final, "ready")):
        return tree
      shutil.rmtree(final, ignore_errors=True)
      scratch = tempfile.mkdtemp(dir=os.path.dirname(final), prefix=".build-")
      try:
        self._export(src, sha, os.path.join(scratch, "tree"))
        open(os.path.join(scratch, "ready"), "w").close()
        os.rename(scratch, final)
      except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return tree

  @staticmethod
  def _export(src: str, sha: str, tree: str) -> None:
    os.makedirs(tree)
    index = os.path.join(os.path.dirname(tree), "index")
    _git("read-tree", sha, cwd=src, env={"GIT_INDEX_FILE": index})
    _git("checkout-index", "-a", f"--prefix={tree}/", cwd=src, env={"GIT_INDEX_FILE": index})
    os.remove(index)
    _git("init", "-q", tree)
    _git("add", "-A", "-f", cwd=tree)
    _git("commit", "-q", "--no-verify", "--allow-empty", "-m", f"base {sha}", cwd=tree)
    subprocess.run(["chmod", "-R", "a+rwX", tree], check=True)


def spec_tree(cache_dir: str, files, owner: int) -> str:
  """The read-only starting tree of a terminal task (`files`: (relative path, text) pairs, already
  validated by `task.parse_terminal_task`), built once per distinct spec under
  `<cache_dir>/specs/<sha256>/tree`. Its files are owned by `owner` (the sandbox uid), modes 0644
  and dirs 0755: the agent's copy-up keeps the owner, so it may chmod them (a task can ask for
  that); the tree itself is only ever an overlay's lower layer, under the 0700 cache root."""
  import hashlib
  import json
  key = hashlib.sha256(json.dumps(list(files), ensure_ascii=False).encode("utf-8", "surrogatepass"))
  final = os.path.join(cache_dir, "specs", key.hexdigest())
  tree = os.path.join(final, "tree")
  if os.path.exists(os.path.join(final, "ready")):
    return tree
  os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
  scratch = tempfile.mkdtemp(dir=os.path.dirname(final), prefix=".build-")
  try:
    os.makedirs(os.path.join(scratch, "tree"))
    for path, text in files:
      dest = os.path.join(scratch, "tree", path)
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      with open(dest, "w", encoding="utf-8", errors="surrogatepass", newline="") as f:
        f.write(text)
    subprocess.run(["chmod", "-R", "u=rwX,go=rX", os.path.join(scratch, "tree")], check=True)
    subprocess.run(["chown", "-R", f"{owner}:{owner}", os.path.join(scratch, "tree")], check=True)
    open(os.path.join(scratch, "ready"), "w").close()
    try:
      os.rename(scratch, final)
    except OSError:   # another executor built the same spec meanwhile
      shutil.rmtree(scratch, ignore_errors=True)
  except BaseException:
    shutil.rmtree(scratch, ignore_errors=True)
    raise
  return tree

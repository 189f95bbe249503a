"""Per-task test environments: a venv built from a spec once per machine, mounted read-only.

A task may carry an `environment` record (SWE-bench's per-repo/version install specs, reduced to
what a sandbox needs):

  {"name": "wcwidth-0.2",                       # optional, for messages
   "python": "3.11",                            # an interpreter this machine has (>= 3.11)
   "requirements": ["pytest==9.0.1", "wcwidth==0.2.13"],   # exact pins, wheels only
   "pytest_args": ["-p", "no:warnings"]}        # optional, before the test files

The executor builds it (`EnvironmentCache.ensure`) into `<cache_dir>/envs/<hash>/`, where the hash
is of the canonical spec: `python -m venv --without-pip` from that Python, then the host's pip
installs the pins into it from the configured index (`--only-binary=:all:`: no package's build
code runs on the host; `pip --python` means the venv holds no pip of its own). Concurrent builds
of one spec are deduplicated in-process (a lock per hash) and across executors on one node (a
file lock); a finished build has a `ready` stamp and `env.json` (the spec, `pip freeze`, the
base interpreter). A failed build raises `EnvironmentBuildError` (pip's log in `build.log`); the
failure is remembered by this process, so a group of samples does not rebuild it eight times.

A run with an environment mounts only that venv and its base interpreter read-only (never the
executor's own venv), runs the launcher with the venv's Python and puts the venv's `bin` first
on PATH. pytest itself comes from the environment: the executor's version is added when the spec
pins none; the results plugin and launcher import nothing but the stdlib and pytest (>= 7).
Without an `environment` a task runs with the executor's own interpreter (`host_interpreter`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Mapping

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

SPEC_KEYS = ("name", "python", "requirements", "pytest_args")
MIN_PYTHON = (3, 11)          # the launcher runs `python -P` (3.11+)
MIN_PYTEST = Version("7.0")
MAX_REQUIREMENTS = 200
BUILD_TIMEOUT_S = 900
_BUILDER_VERSION = "1"        # bump when the build recipe changes: a new hash, a fresh build
_PY_RE = re.compile(r"^(\d)\.(\d{1,2})$")


class EnvironmentSpecError(ValueError):
  """A malformed `environment` record; the message starts with the offending field."""


class EnvironmentBuildError(RuntimeError):
  """The environment could not be built on this machine (no such Python, pip failed, ...)."""


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  python: str
  requirements: tuple[str, ...]
  pytest_args: tuple[str, ...] = ()
  name: str = ""

  @property
  def key(self) -> str:
    """The content hash the build is cached under (the name is a label, not part of it)."""
    canon = json.dumps({"builder": _BUILDER_VERSION, "python": self.python,
                        "requirements": sorted(self.requirements),
                        "pytest_args": list(self.pytest_args)}, sort_keys=True)
    return hashlib.sha256(canon.encode()).hexdigest()[:32]

  @property
  def label(self) -> str:
    return f"{self.name or 'environment'} ({self.key[:12]})"


def parse_spec(value: Any) -> EnvSpec:
  """Validates an `environment` record; raises EnvironmentSpecError naming the field."""
  if not isinstance(value, Mapping):
    raise EnvironmentSpecError(f"environment: expected an object, got {type(value).__name__}")
  unknown = sorted(set(value) - set(SPEC_KEYS))
  if unknown:
    raise EnvironmentSpecError(f"environment: unknown key(s) {unknown} (known: {list(SPEC_KEYS)})")
  name = value.get("name", "")
  if not isinstance(name, str) or len(name) > 200:
    raise EnvironmentSpecError("environment.name: expected a string of at most 200 characters")
  python = value.get("python")
  m = _PY_RE.match(python) if isinstance(python, str) else None
  if m is None:
    raise EnvironmentSpecError(f"environment.python: expected a version like '3.11', got {python!r}")
  if (int(m.group(1)), int(m.group(2))) < MIN_PYTHON:
    raise EnvironmentSpecError(f"environment.python: {python} is older than "
                               f"{'.'.join(map(str, MIN_PYTHON))} (the sandbox launcher needs -P)")
  reqs = value.get("requirements", [])
  if not isinstance(reqs, (list, tuple)) or not all(isinstance(r, str) for r in reqs):
    raise EnvironmentSpecError("environment.requirements: expected a list of 'name==version' strings")
  if len(reqs) > MAX_REQUIREMENTS:
    raise EnvironmentSpecError(f"environment.requirements: {len(reqs)} pins, more than {MAX_REQUIREMENTS}")
  names: dict[str, str] = {}
  for line in reqs:
    try:
      req = Requirement(line)
    except InvalidRequirement as e:
      raise EnvironmentSpecError(f"environment.requirements: {line!r} is not a requirement ({e})") from None
    specs = list(req.specifier)
    if req.url or req.marker or len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
      raise EnvironmentSpecError(f"environment.requirements: {line!r} is not an exact pin "
                                 "'name==version' (no ranges, wildcards, URLs or markers)")
    canon = canonicalize_name(req.name)
    if canon in names:
      raise EnvironmentSpecError(f"environment.requirements: {req.name!r} is pinned twice")
    names[canon] = specs[0].version
  if "pytest" in names and Version(names["pytest"]) < MIN_PYTEST:
    raise EnvironmentSpecError(f"environment.requirements: pytest=={names['pytest']} is older than "
                               f"{MIN_PYTEST} (the results plugin's hooks)")
  requirements = tuple(reqs)
  if "pytest" not in names:
    requirements += (f"pytest=={_host_pytest_version()}",)
  args = value.get("pytest_args", [])
  if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) and "\0" not in a for a in args):
    raise EnvironmentSpecError("environment.pytest_args: expected a list of strings")
  if len(args) > 64 or sum(len(a) for a in args) > 8192:
    raise EnvironmentSpecError("environment.pytest_args: more than 64 arguments or 8 KiB")
  return EnvSpec(python=python, requirements=requirements, pytest_args=tuple(args), name=name)


@functools.lru_cache(maxsize=1)
def _host_pytest_version() -> str:
  from importlib import metadata
  return metadata.version("pytest")


@dataclasses.dataclass(frozen=True)
class Interpreter:
  """What a sandbox run needs of a Python: the executable, the host directories to mount
  read-only at their own paths, and the directory to put first on PATH."""
  executable: str
  binds: tuple[str, ...]
  bin_dir: str
  key: str = "host"
  pytest_args: tuple[str, ...] = ()


def _outside_system(paths) -> tuple[str, ...]:
  """The paths not under /usr or /etc (those are mounted already), without nested duplicates."""
  out: list[str] = []
  for p in paths:
    if p.startswith(("/usr/", "/etc/")) or p in ("/usr", "/etc"):
      continue
    if not any(p == q or p.startswith(q + "/") for q in out):
      out.append(p)
  return tuple(out)


def host_interpreter() -> Interpreter:
  """The executor's own interpreter (tasks without an environment): its venv and base Python."""
  return Interpreter(sys.executable, _outside_system(
      [sys.prefix, os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))]),
      os.path.dirname(sys.executable))


def find_python(version: str) -> str:
  """An interpreter of `version` ('3.12') on this machine: this one, `python3.12` on PATH, or a
  pyenv build; raises EnvironmentBuildError naming where it looked."""
  if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
    return os.path.realpath(sys.executable)
  found = shutil.which(f"python{version}")
  if found:
    return os.path.realpath(found)
  root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
  for candidate in sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")),
                          reverse=True):
    if os.access(candidate, os.X_OK):
      return os.path.realpath(candidate)
  raise EnvironmentBuildError(f"no Python {version} on this machine (looked for this interpreter, "
                              f"python{version} on PATH and {root}/versions/{version}.*)")


class EnvironmentCache:
  """Builds and finds environments under `<cache_dir>/envs/` (see the module docstring)."""

  def __init__(self, cache_dir: str):
    self.root = os.path.join(cache_dir, "envs")
    os.makedirs(self.root, mode=0o700, exist_ok=True)
    self._locks: dict[str, asyncio.Lock] = {}
    self._failed: dict[str, str] = {}
    self.builds = 0                        # builds done by this process (tests, metrics)

  def path(self, spec: EnvSpec) -> str:
    return os.path.join(self.root, spec.key)

  async def ensure(self, spec: EnvSpec) -> Interpreter:
    """The built environment for `spec` (built now if needed); raises EnvironmentBuildError."""
    if spec.key in self._failed:
      raise EnvironmentBuildError(self._failed[spec.key])
    lock = self._locks.setdefault(spec.key, asyncio.Lock())
    async with lock:
      if spec.key in self._failed:
        raise EnvironmentBuildError(self._failed[spec.key])
      try:
        return await asyncio.to_thread(self.ensure_sync, spec)
      except EnvironmentBuildError as e:
        self._failed[spec.key] = str(e)
        raise

  def ensure_sync(self, spec: EnvSpec) -> Interpreter:
    final = self.path(spec)
    if not os.path.exists(os.path.join(final, "ready")):
      with open(final + ".lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)   # several executors on one node share the cache
        if not os.path.exists(os.path.join(final, "ready")):
          self._build(spec, final)
    with open(os.path.join(final, "env.json")) as f:
      info = json.load(f)
    python = os.path.join(final, "bin", "python")
    return Interpreter(python, _outside_system([final, info["base_prefix"]]), os.path.join(final, "bin"),
                       key=spec.key, pytest_args=spec.pytest_args)

  def _build(self, spec: EnvSpec, final: str) -> None:
    # Built where it will live: a venv's scripts name their own path, so it cannot be moved.
    shutil.rmtree(final, ignore_errors=True)
    base = find_python(spec.python)
    log_path = final + ".build.log"
    start = time.monotonic()
    print(f"[sandbox] building {spec.label}: Python {spec.python}, {len(spec.requirements)} pins",
          file=sys.stderr, flush=True)
    with open(log_path, "w") as log:
      def step(argv, timeout):
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        try:
          proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                                     "PIP_NO_INPUT": "1", "PYTHONNOUSERSITE": "1"})
        except subprocess.TimeoutExpired:
          raise EnvironmentBuildError(f"{spec.label}: {argv[2] if len(argv) > 2 else argv[0]} "
                                      f"timed out after {timeout} s (log: {log_path})") from None
        if proc.returncode:
          log.flush()
          raise EnvironmentBuildError(f"{spec.label}: `{' '.join(argv[:4])} ...` failed "
                                      f"(exit {proc.returncode}): {_tail(log_path)}")
      try:
        step([base, "-m", "venv", "--without-pip", final], 120)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as reqs:
          reqs.write("\n".join(spec.requirements) + "\n")
        try:
          step([sys.executable, "-m", "pip", "--python", os.path.join(final, "bin", "python"),
                "install", "--only-binary=:all:", "--no-warn-script-location", "-r", reqs.name],
               BUILD_TIMEOUT_S)
        finally:
          os.unlink(reqs.name)
        probe = subprocess.run(
            [os.path.join(final, "bin", "python"), "-P", "-s", "-c",
             "import json, sys, pytest; print(json.dumps({'base_prefix': sys.base_prefix, "
             "'version': sys.version.split()[0], 'pytest': pytest.__version__}))"],
            capture_output=True, text=True, timeout=60)
        if probe.returncode:
          raise EnvironmentBuildError(f"{spec.label}: the built interpreter cannot import pytest: "
                                      f"{probe.stderr.strip()[-400:]}")
        info = json.loads(probe.stdout)
        freeze = subprocess.run([sys.executable, "-m", "pip", "--python", os.path.join(final, "bin", "python"),
                                 "freeze", "--all"], capture_output=True, text=True, timeout=120).stdout
      except BaseException:
        shutil.rmtree(final, ignore_errors=True)
        raise
    info.update(spec=dataclasses.asdict(spec), key=spec.key, freeze=freeze.splitlines(),
                build_s=round(time.monotonic() - start, 1))
    with open(os.path.join(final, "env.json"), "w") as f:
      json.dump(info, f, indent=1)
    subprocess.run(["chmod", "-R", "a+rX", final], check=True)
    open(os.path.join(final, "ready"), "w").close()
    self.builds += 1
    print(f"[sandbox] built {spec.label} in {info['build_s']} s", file=sys.stderr, flush=True)


def _tail(path: str, n: int = 800) -> str:
  with open(path, errors="replace") as f:
    text = f.read()
  lines = [line for line in text.splitlines() if line.strip()]
  return " | ".join(lines[-6:])[-n:]

"""Integrity checks on the agent's patch, before anything runs, and on what a run changed.

A finding is a string `"<code>: <path or detail>"`; any finding makes the reward 0. Findings in
`UNSAFE` mean the patch is never applied (binary, ed-style, symlinks, paths that escape the tree,
text unidiff cannot parse); the others (test files, conftest, pytest config, site hooks) are
applied, force-restored from base_commit before the tests run, and still zero the reward.
"""
from __future__ import annotations

import fnmatch
import posixpath
import re
import tomllib
from typing import Iterable

import iniconfig
import unidiff

from dockyard.sandbox.isolation import OVERFLOW_KEY

UNSAFE = ("unparseable_patch", "ed_style_hunk", "binary_patch", "symlink", "path_escape")

PYTEST_CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml")
SECTIONED_CONFIG_FILES = ("pyproject.toml", "setup.cfg", "tox.ini")
SITE_HOOK_MODULES = ("sitecustomize", "usercustomize")
TEST_DIRS = ("tests", "test")
_ED_LINE = re.compile(r"^\d+(,\d+)?[acd](\d+(,\d+)?)?$", re.M)
_MODE_LINE = re.compile(r"^(new file mode|deleted file mode|old mode|new mode) (\d+)$", re.M)


def _strip_prefix(path: str | None) -> str | None:
  if path is None or path == "/dev/null":
    return None
  if path.startswith(("a/", "b/")):
    path = path[2:]
  return path


def patch_paths(patch: str) -> list[str]:
  """Every path a unified diff touches (source and target), without a/ b/ prefixes."""
  out = []
  for pf in unidiff.PatchSet(patch):
    for p in (_strip_prefix(pf.source_file), _strip_prefix(pf.target_file)):
      if p and p not in out:
        out.append(p)
  return out


def escapes_tree(path: str) -> bool:
  """A patch path that could leave the tree or reach its git metadata (absolute, `..`, `.git`,
  a backslash)."""
  parts = path.split("/")
  return path.startswith("/") or ".." in parts or ".git" in parts or "\\" in path


def is_test_path(path: str) -> bool:
  parts = path.split("/")
  name = parts[-1]
  return (any(d in TEST_DIRS for d in parts[:-1]) or fnmatch.fnmatch(name, "test_*.py")
          or fnmatch.fnmatch(name, "*_test.py") or name == "conftest.py")


def is_site_hook(path: str) -> bool:
  """A module `site` would run, in any form: a `.pth` file anywhere, or `sitecustomize` /
  `usercustomize` as a module file of any suffix or as a package directory, at any depth (the
  launcher keeps the tree off sys.path at start-up, so these are flagged, not run)."""
  parts = path.split("/")
  return parts[-1].endswith(".pth") or any(
      p.split(".", 1)[0] in SITE_HOOK_MODULES for p in parts)


def is_protected(path: str) -> bool:
  """Paths whose content at base_commit is forced back before the tests run."""
  name = posixpath.basename(path)
  return (is_test_path(path) or is_site_hook(path) or name in PYTEST_CONFIG_FILES)


def check_patch(patch: str, test_patch_paths: Iterable[str] = ()) -> list[str]:
  """Static findings on the agent's patch (an empty patch has none: it just resolves nothing)."""
  if not patch.strip():
    return []
  findings = []
  if _ED_LINE.search(patch):
    findings.append("ed_style_hunk: the patch contains ed/normal-diff commands")
  if "GIT binary patch" in patch or re.search(r"^Binary files .* differ$", patch, re.M):
    findings.append("binary_patch: the patch carries binary content")
  for _, mode in _MODE_LINE.findall(patch):
    if mode.startswith("120"):
      findings.append("symlink: the patch creates or changes a symlink")
      break
  try:
    patch_set = unidiff.PatchSet(patch)
  except unidiff.UnidiffParseError as e:
    return findings + [f"unparseable_patch: {e}"]
  if not len(patch_set):
    return findings + ["unparseable_patch: no unified-diff file sections found"]
  held_out = set(test_patch_paths)
  for pf in patch_set:
    if pf.is_binary_file:
      findings.append(f"binary_patch: {pf.path}")
    for path in {_strip_prefix(pf.source_file), _strip_prefix(pf.target_file)} - {None}:
      if escapes_tree(path):
        findings.append(f"path_escape: {path}")
      elif path in held_out:
        findings.append(f"touches_test_patch_path: {path}")
      elif posixpath.basename(path) == "conftest.py":
        findings.append(f"touches_conftest: {path}")
      elif is_test_path(path):
        findings.append(f"touches_test_file: {path}")
      elif posixpath.basename(path) in PYTEST_CONFIG_FILES:
        findings.append(f"touches_pytest_config: {path}")
      elif is_site_hook(path):
        findings.append(f"touches_site_hook: {path}")
  return list(dict.fromkeys(findings))


def is_unsafe(findings: Iterable[str]) -> bool:
  return any(f.split(":", 1)[0] in UNSAFE for f in findings)


def _pytest_sections(name: str, path: str, text: str):
  """The pytest-relevant part of a sectioned config file, comparable between versions, read by
  the parsers pytest itself uses (iniconfig for .ini/.cfg, tomllib for TOML): a header that
  configparser reads differently from iniconfig (`[tool:pytest] ;]`) cannot slip through."""
  if name == "pyproject.toml":
    return tomllib.loads(text).get("tool", {}).get("pytest")
  ini = iniconfig.IniConfig(path, data=text)
  wanted = ("tool:pytest", "pytest") if name == "setup.cfg" else ("pytest",)
  return {s: dict(ini[s].items()) for s in wanted if s in ini}


def config_finding(path: str, before: str | None, after: str | None) -> str | None:
  """A finding if `path` (pyproject.toml, setup.cfg, tox.ini) changed its pytest sections."""
  name = posixpath.basename(path)
  if name not in SECTIONED_CONFIG_FILES:
    return None
  try:
    old = _pytest_sections(name, path, before) if before is not None else None
    new = _pytest_sections(name, path, after) if after is not None else None
  except (tomllib.TOMLDecodeError, iniconfig.ParseError) as e:
    return f"touches_pytest_config: {path} (cannot parse: {str(e).splitlines()[0]})"
  return None if old == new or (not old and not new) else f"touches_pytest_config: {path}"


def run_findings(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
  """Findings from what the test run itself wrote into the tree (upper-layer snapshots)."""
  findings = []
  if OVERFLOW_KEY in after:
    findings.append(f"run_wrote_too_many_files: more than {len(after) - 1} entries in the tree")
  for path, meta in sorted(after.items()):
    if path == OVERFLOW_KEY:
      continue
    if before.get(path) == meta or "__pycache__" in path.split("/"):
      continue
    kind = meta[0]
    name = posixpath.basename(path)
    if kind == "link":
      findings.append(f"run_created_symlink: {path}")
    elif (name == "conftest.py" or name in PYTEST_CONFIG_FILES or is_site_hook(path)
          or name in SECTIONED_CONFIG_FILES):
      findings.append(f"run_wrote_config: {path}")
  return findings

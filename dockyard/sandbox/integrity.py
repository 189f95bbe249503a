"""Integrity checks on the agent's patch, before anything runs, and on what a run changed.

A finding is a string `"<code>: <path or detail>"`; any finding makes the reward 0. Findings in
`UNSAFE` mean the patch is never applied (binary, ed-style, symlinks, paths that escape the tree,
text unidiff cannot parse); the others (test files, conftest, pytest config, site hooks) are
applied, force-restored from base_commit before the tests run, and still zero the reward.
"""
from __future__ import annotations

import configparser
import fnmatch
import posixpath
import re
import tomllib
from typing import Iterable

import unidiff

UNSAFE = ("unparseable_patch", "ed_style_hunk", "binary_patch", "symlink", "path_escape")

PYTEST_CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml")
SECTIONED_CONFIG_FILES = ("pyproject.toml", "setup.cfg", "tox.ini")
SITE_HOOK_PATTERNS = ("sitecustomize.py", "usercustomize.py", "*.pth")
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


def is_test_path(path: str) -> bool:
  parts = path.split("/")
  name = parts[-1]
  return (any(d in TEST_DIRS for d in parts[:-1]) or fnmatch.fnmatch(name, "test_*.py")
          or fnmatch.fnmatch(name, "*_test.py") or name == "conftest.py")


def is_site_hook(path: str) -> bool:
  return any(fnmatch.fnmatch(posixpath.basename(path), p) for p in SITE_HOOK_PATTERNS)


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
      parts = path.split("/")
      if path.startswith("/") or ".." in parts or ".git" in parts or "\\" in path:
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


def _pytest_sections(name: str, text: str):
  """The pytest-relevant part of a sectioned config file, comparable between versions."""
  if name == "pyproject.toml":
    return tomllib.loads(text).get("tool", {}).get("pytest")
  parser = configparser.ConfigParser(interpolation=None, strict=False)
  parser.read_string(text)
  wanted = ("tool:pytest", "pytest") if name == "setup.cfg" else ("pytest",)
  return {s: dict(parser[s]) for s in wanted if parser.has_section(s)}


def config_finding(path: str, before: str | None, after: str | None) -> str | None:
  """A finding if `path` (pyproject.toml, setup.cfg, tox.ini) changed its pytest sections."""
  name = posixpath.basename(path)
  if name not in SECTIONED_CONFIG_FILES:
    return None
  try:
    old = _pytest_sections(name, before) if before is not None else None
    new = _pytest_sections(name, after) if after is not None else None
  except (tomllib.TOMLDecodeError, configparser.Error) as e:
    return f"touches_pytest_config: {path} (cannot parse: {str(e).splitlines()[0]})"
  return None if old == new or (not old and not new) else f"touches_pytest_config: {path}"


def run_findings(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
  """Findings from what the test run itself wrote into the tree (upper-layer snapshots)."""
  findings = []
  for path, meta in sorted(after.items()):
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

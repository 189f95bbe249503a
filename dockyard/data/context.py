"""Code context for a task's prompt: the source files to show the agent, read at `base_commit`.

Single-shot patch tasks need the code in the prompt. Which files: SWE-bench's "oracle" retrieval,
the files the gold patch edits (for our tasks, the one mutated file). `file_context` returns their
text at the buggy commit from the local task repo, optionally cut to a window of lines around the
gold hunks so a small prompt budget still holds the bug. Tokenizing and the chat template are the
environment's business.
"""
from __future__ import annotations

import dataclasses
import os
import re

from dockyard.data import repos
from dockyard.data.swe import SweTask

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", re.M)


@dataclasses.dataclass
class FileContext:
  path: str             # relative to the repo root
  text: str             # the file (or the window) at base_commit
  first_line: int = 1   # line number of text's first line in the file


def edited_files(patch: str) -> list[str]:
  """Files a unified diff edits (in order, no duplicates)."""
  out = []
  for m in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, re.M):
    if m.group(1) not in out:
      out.append(m.group(1))
  if not out:
    out = [m.group(1) for m in re.finditer(r"^--- a/(\S+)$", patch, re.M)]
  return out


def hunk_lines(patch: str, path: str) -> list[tuple[int, int]]:
  """(start, length) in the old file of each hunk of `patch` that edits `path`."""
  spans, current = [], None
  for line in patch.splitlines():
    m = re.match(r"^diff --git a/(\S+) b/", line)
    if m:
      current = m.group(1)
      continue
    h = _HUNK.match(line)
    if h and current == path:
      spans.append((int(h.group(1)), int(h.group(2) or 1)))
  return spans


def file_context(task: SweTask, repos_dir: str | None = None, window: int | None = None) -> list[FileContext]:
  """The gold-edited files at the task's base commit; `window` keeps that many lines around each hunk."""
  repo_dir = os.path.join(repos_dir or repos.default_repos_dir(), repos.repo_dirname(task.repo))
  if not os.path.isdir(repo_dir):
    raise FileNotFoundError(f"task repo {repo_dir} does not exist; run "
                            "`python -m dockyard.data.build_swe_tasks --setup-repos`")
  files = edited_files(task.patch)
  if not files:
    raise ValueError(f"task {task.instance_id}: its patch edits no file")
  out = []
  for path in files:
    text = repos.git(repo_dir, "show", f"{task.base_commit}:{path}")
    if window is None:
      out.append(FileContext(path, text))
      continue
    lines = text.splitlines(keepends=True)
    spans = hunk_lines(task.patch, path) or [(1, len(lines))]
    lo = max(1, min(s for s, _ in spans) - window)
    hi = min(len(lines), max(s + n for s, n in spans) + window)
    out.append(FileContext(path, "".join(lines[lo - 1:hi]), lo))
  return out

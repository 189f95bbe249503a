"""Prompt code context: the gold-edited file at the buggy commit, whole or as a window around the bug."""
import pytest

from dockyard.data import context


def test_context_shows_the_buggy_code(swe_repos, tiny_tasks):
  repos_dir, _ = swe_repos
  task = tiny_tasks[0]
  (whole,) = context.file_context(task, repos_dir)
  assert whole.path == task.meta["file"] and whole.first_line == 1
  removed = [l[1:] for l in task.patch.splitlines() if l.startswith("-") and not l.startswith("---")]
  added = [l[1:] for l in task.patch.splitlines() if l.startswith("+") and not l.startswith("+++")]
  lines = whole.text.splitlines()
  # The buggy tree holds the lines the gold patch removes, not the ones it adds back.
  assert all(l in lines for l in removed if l.strip())
  assert any(l not in lines for l in added if l.strip()) or not added
  (win,) = context.file_context(task, repos_dir, window=5)
  assert win.text in whole.text and len(win.text.splitlines()) <= 5 * 2 + 7
  assert lines[win.first_line - 1] == win.text.splitlines()[0]


def test_edited_files_and_missing_repo(tmp_path, tiny_tasks):
  patch = "diff --git a/a/x.py b/a/x.py\n--- a/a/x.py\n+++ b/a/x.py\n@@ -3,2 +3,2 @@\n"
  assert context.edited_files(patch) == ["a/x.py"]
  assert context.hunk_lines(patch, "a/x.py") == [(3, 2)]
  with pytest.raises(FileNotFoundError, match="--setup-repos"):
    context.file_context(tiny_tasks[0], str(tmp_path))

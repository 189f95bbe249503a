"""Diff extraction and normalization from model completions (the SWE env's parser)."""
import subprocess

import pytest

from dockyard.envs import patch_extract

GOOD = """diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,3 +1,3 @@
 def add(a, b):
-    return a - b
+    return a + b
 
"""


def test_fenced_block_with_prose_around():
  text = "Here is the fix:\n```diff\n" + GOOD + "```\nThis flips the operator."
  got = patch_extract.extract_patch(text)
  assert got.patch == GOOD and got.files == ("pkg/mod.py",)


def test_raw_diff_with_trailing_prose_is_trimmed():
  got = patch_extract.extract_patch("Fix below.\n" + GOOD.rstrip("\n") + "\nThat should do it.\n")
  assert got.patch is not None and "That should" not in got.patch
  assert got.patch.endswith("+    return a + b\n \n")


def test_headers_without_prefix_get_a_b_and_crlf_is_normalized():
  raw = "--- pkg/mod.py\r\n+++ pkg/mod.py\r\n@@ -2 +2 @@\r\n-    return a - b\r\n+    return a + b\r\n"
  got = patch_extract.extract_patch(raw)
  assert got.patch.splitlines()[:2] == ["--- a/pkg/mod.py", "+++ b/pkg/mod.py"]
  assert "\r" not in got.patch


@pytest.mark.parametrize("text, reason", [
    ("", "empty completion"),
    ("I think the bug is in add().", "no unified diff"),
    ("```diff\n--- a/x.py\n+++ b/x.py\nnot a hunk\n```", "does not parse"),
    ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n", "does not parse"),
])
def test_malformed_has_a_reason(text, reason):
  got = patch_extract.extract_patch(text)
  assert got.patch is None and reason in got.reason


def test_extracted_patch_applies_with_git(tmp_path):
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "mod.py").write_text("def add(a, b):\n    return a - b\n\n")
  subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
  got = patch_extract.extract_patch("```diff\n" + GOOD + "```")
  res = subprocess.run(["git", "apply", "-"], input=got.patch, text=True, cwd=tmp_path, capture_output=True)
  assert res.returncode == 0, res.stderr
  assert "a + b" in (tmp_path / "pkg" / "mod.py").read_text()


def test_wrong_hunk_counts_are_recounted_from_the_body(tmp_path):
  wrong = GOOD.replace("@@ -1,3 +1,3 @@", "@@ -1,7 +1,2 @@")
  got = patch_extract.extract_patch("```diff\n" + wrong + "```")
  assert got.patch is not None and "@@ -1,3 +1,3 @@" in got.patch
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "mod.py").write_text("def add(a, b):\n    return a - b\n\n")
  (tmp_path / "fix.patch").write_text(got.patch)
  res = subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, capture_output=True, text=True)
  assert res.returncode == 0, res.stderr


def test_compact_patch_keeps_the_edit_in_fewer_lines():
  long = GOOD.replace("diff --git a/pkg/mod.py b/pkg/mod.py\n",
                      "diff --git a/pkg/mod.py b/pkg/mod.py\nindex 1234567..89abcde 100644\n")
  short = patch_extract.compact_patch(long, context=0)
  assert short == "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -2,1 +2,1 @@\n-    return a - b\n+    return a + b\n"
  with pytest.raises(ValueError, match="context"):
    patch_extract.compact_patch(GOOD, context=-1)

"""Which files the SWE prompt shows, and how the token budget cuts them (a documented choice)."""
from dockyard.envs import swe

GOLD = """diff --git a/pkg/big.py b/pkg/big.py
--- a/pkg/big.py
+++ b/pkg/big.py
@@ -150,3 +150,3 @@
 x149 = 149
-x150 = 0
+x150 = 150
 x151 = 151
"""
TASK = {"repo": "o/p", "base_commit": "abc", "problem_statement": "x150 is wrong", "patch": GOLD,
        "test_patch": "diff --git a/tests/test_big.py b/tests/test_big.py\n"}
BIG = "\n".join(f"x{i} = {i}" for i in range(1, 400)) + "\n"


def words(text):
  return len(text.split())


def test_whole_file_when_it_fits():
  msgs = swe.build_prompt(TASK, lambda p: BIG if p == "pkg/big.py" else None, words, budget=10_000)
  user = msgs[1]["content"]
  assert "[start of pkg/big.py]" in user and "x1 = 1" in user and "x399 = 399" in user
  assert "x150 is wrong" in user
  assert "tests/test_big.py" not in user  # held-out tests are never shown


def test_excerpt_around_gold_hunks_when_it_does_not_fit():
  msgs = swe.build_prompt(TASK, lambda p: BIG, words, budget=250)
  user = msgs[1]["content"]
  assert "(excerpt)" in user and "x150 = 150" in user
  assert "x1 = 1\n" not in user and "x399" not in user
  assert words(msgs[0]["content"]) + words(user) <= 250


def test_no_file_when_even_the_smallest_excerpt_is_too_big():
  msgs = swe.build_prompt(TASK, lambda p: BIG, words, budget=40)
  assert "[start of" not in msgs[1]["content"]


def test_long_issue_is_cut_to_its_budget_keeping_the_head():
  issue = "title: x150 is wrong\n" + "\n".join(f"trace line {i} " + "y" * 300 for i in range(50))
  cut = swe.shorten_issue(issue, words, budget=30)
  assert cut.startswith("title: x150 is wrong") and cut.endswith("...")
  assert words(cut) <= 31 and "y" * 101 not in cut
  assert swe.shorten_issue("short issue", words, budget=30) == "short issue"
  msgs = swe.build_prompt({**TASK, "problem_statement": issue}, lambda p: BIG, words, budget=250,
                          issue_budget=30)
  assert "trace line 49" not in msgs[1]["content"] and "x150 = 150" in msgs[1]["content"]


def test_gold_completion_is_the_compact_patch_in_a_diff_fence():
  env = swe.SweEnv(None, words, gold_context=0)
  gold = env.gold_completion(TASK)
  assert gold.startswith("```diff\n--- a/pkg/big.py") and gold.endswith("```")
  assert "diff --git" not in gold and "x149 = 149" not in gold and "+x150 = 150" in gold

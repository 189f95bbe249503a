"""The committed task set: size, package splits, schema, tiny subset, manifest consistency."""
import collections
import json
import os
import re

import pytest

from dockyard.data import repos, swe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data", "swe")
MANIFEST = os.path.join(DATA, "manifest.json")

SPLITS = ("train", "validation", "test")


@pytest.fixture(scope="module")
def manifest():
  with open(MANIFEST) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def splits():
  return {s: swe.load_tasks(os.path.join(DATA, f"{s}.jsonl")) for s in SPLITS}


def test_size_and_packages(splits, manifest):
  tasks = [t for s in SPLITS for t in splits[s]]
  per_pkg = collections.Counter(t.meta["package"] for t in tasks)
  assert len(tasks) >= 200, per_pkg
  assert len(per_pkg) >= 5, per_pkg
  assert manifest["totals"]["kept"] == len(tasks)
  assert {p: c["kept"] for p, c in manifest["counts"].items()} == dict(per_pkg)
  for c in manifest["counts"].values():
    assert c["candidates"] == c["kept"] + sum(c["dropped"].values())


def test_splits_are_by_package(splits, manifest):
  pkgs = {s: {t.meta["package"] for t in splits[s]} for s in SPLITS}
  assert pkgs["train"] and pkgs["test"]
  assert not pkgs["train"] & pkgs["test"] and not pkgs["train"] & pkgs["validation"]
  assert not pkgs["validation"] & pkgs["test"]
  declared = {p["name"]: p["split"] for p in manifest["packages"]}
  for s in SPLITS:
    assert all(declared[p] == s and t.meta["split"] == s for t in splits[s] for p in [t.meta["package"]])


def test_manifest_pins_match_inputs(manifest):
  pins = {p.name: p for p in repos.load_packages(os.path.join(DATA, "packages.json"))}
  for p in repos.load_packages(MANIFEST):
    assert pins[p.name] == p
    assert re.fullmatch(r"[0-9a-f]{64}", p.sha256)
  assert set(manifest["pristine_commits"]) == {p.repo for p in pins.values()}
  assert manifest["validator"]["name"] in ("direct-3x3", "sandbox-3x3")


def test_every_record_is_a_valid_task(splits):
  ids = set()
  for s in SPLITS:
    for t in splits[s]:
      assert t.instance_id not in ids
      ids.add(t.instance_id)
      assert re.fullmatch(r"[0-9a-f]{40}", t.base_commit)
      assert t.FAIL_TO_PASS and t.PASS_TO_PASS, t.instance_id
      assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
      files = {x.split("::")[0] for x in t.FAIL_TO_PASS + t.PASS_TO_PASS}
      assert files == set(t.meta["test_files"]) and 1 <= len(files) <= 2
      touched = re.findall(r"^diff --git a/(\S+) b/", t.patch, re.M)
      assert touched == [t.meta["file"]] and touched[0] not in files
      assert t.test_patch == "" and t.version and t.created_at
      assert t.problem_statement.startswith("`") and t.FAIL_TO_PASS[0].split("::")[0] in t.problem_statement
      assert t.meta["validator"] in ("direct-3x3", "sandbox-3x3")


def test_tiny_subset(splits, tiny_tasks, manifest):
  train = {t.instance_id: t for t in splits["train"]}
  assert 15 <= len(tiny_tasks) <= 25 and manifest["totals"]["tiny"] == len(tiny_tasks)
  assert len({t.meta["package"] for t in tiny_tasks}) >= 2
  for t in tiny_tasks:
    assert train[t.instance_id] == t
    assert len(t.meta["test_files"]) == 1 and t.meta["func_lines"] <= 15

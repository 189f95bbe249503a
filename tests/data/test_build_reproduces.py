"""The builder reproduces the committed records: a fresh build of a prefix of one package's tasks.

Candidates are tried in a seeded order and kept in order, so a build stopped after k kept tasks
must produce exactly the first k tasks the full build kept (same ids, commits, patches, tests,
problem statements). Built from scratch here: new repos dir, new work dir.
"""
import json
import os

from dockyard.data import build_swe_tasks, swe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data", "swe")
MANIFEST = os.path.join(DATA, "manifest.json")

PACKAGE = "inflection"   # one test file of ~0.3 s: the cheapest package to rebuild


def test_builder_reproduces_committed_prefix(tmp_path):
  with open(MANIFEST) as f:
    manifest = json.load(f)
  split = next(p["split"] for p in manifest["packages"] if p["name"] == PACKAGE)
  committed = {t.instance_id: t for t in swe.load_tasks(os.path.join(DATA, f"{split}.jsonl"))
               if t.meta["package"] == PACKAGE}
  out = tmp_path / "out"
  rc = build_swe_tasks.main([
      f"--only={PACKAGE}", "--max_kept=2", f"--seed={manifest['seed']}",
      f"--max_candidates={manifest['options']['max_candidates']}",
      f"--out={out}", f"--repos_dir={tmp_path / 'repos'}", f"--work_dir={tmp_path / 'work'}"])
  assert rc == 0
  built = swe.load_tasks(str(out / f"{split}.jsonl"))
  assert len(built) == 2
  for t in built:
    assert t.instance_id in committed, f"{t.instance_id} was not in the committed {split}.jsonl"
    assert t == committed[t.instance_id]
  counts = json.loads((out / "manifest.json").read_text())
  assert counts["pristine_commits"]["jpvanhal/inflection"] == manifest["pristine_commits"]["jpvanhal/inflection"]

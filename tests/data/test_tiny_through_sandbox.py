"""The tiny subset through the real sandbox: every gold patch resolves, every empty patch fails.

The sandbox finds the repos under $DOCKYARD_REPOS_DIR, pointed here at the fresh repos the
`swe_repos` fixture made from the pinned sdists.
"""
import pytest

from dockyard.data import validate_swe


@pytest.mark.slow
async def test_tiny_through_sandbox(swe_repos, tiny_tasks, monkeypatch):
  repos_dir, _ = swe_repos
  monkeypatch.setenv("DOCKYARD_REPOS_DIR", repos_dir)
  checks = await validate_swe.check_with_sandbox(tiny_tasks, repeats=1)
  assert len(checks) == len(tiny_tasks)
  bad = {c.instance_id: (c.gold_resolved, c.empty_resolved, c.reasons[:2]) for c in checks if not c.ok}
  assert not bad, bad

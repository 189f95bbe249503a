"""Importing SWE-bench-format records with an environment registry (issue 22 item 2), and the
runner's repo check for tasks that are not built from dockyard's manifest."""
import json
import subprocess
import sys

import pytest

from dockyard.data import import_swe, repos, swe

PY = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _record(i, repo, version, **kw):
  return dict(instance_id=f"{repo.replace('/', '__')}-{i}", repo=repo, base_commit="a" * 40,
              patch="diff --git a/x.py b/x.py\n", test_patch="", version=version,
              FAIL_TO_PASS=json.dumps(["tests/test_x.py::test_a"]), PASS_TO_PASS="[]",
              problem_statement="it breaks", **kw)


def test_registry_attaches_by_repo_and_version(tmp_path, capsys):
  tasks = tmp_path / "tasks.jsonl"
  own = {"python": PY, "requirements": ["six==1.16.0"]}
  records = [_record(1, "psf/requests", "2.31", image_name="sweb.eval.x"),
             _record(2, "psf/requests", "2.0"),
             _record(3, "pallets/click", "8.1"),
             _record(4, "acme/own", "1", environment=own)]
  tasks.write_text("".join(json.dumps(r) + "\n" for r in records))
  registry = tmp_path / "envs.json"
  exact = {"name": "requests-2.31", "python": PY, "requirements": ["pytest==9.0.1", "idna==3.7"]}
  loose = {"name": "requests", "python": PY, "requirements": ["idna==3.6"]}
  registry.write_text(json.dumps({"psf/requests@2.31": exact, "psf/requests": loose}))
  repos_dir = tmp_path / "repos"
  (repos_dir / "psf__requests").mkdir(parents=True)
  out = tmp_path / "out.jsonl"
  assert import_swe.main(["--tasks", str(tasks), "--environments", str(registry), "--out", str(out),
                          "--repos_dir", str(repos_dir)]) == 0
  got = {t.instance_id: t for t in swe.load_tasks(str(out))}
  assert got["psf__requests-1"].environment == exact
  assert got["psf__requests-2"].environment == loose
  assert got["pallets__click-3"].environment is None
  assert got["acme__own-4"].environment == own                       # the record's own, kept
  assert got["psf__requests-1"].extra == {"image_name": "sweb.eval.x"}   # unknown keys kept
  assert got["psf__requests-1"].FAIL_TO_PASS == ["tests/test_x.py::test_a"]   # JSON strings decoded
  wire = got["psf__requests-1"].sandbox_dict("P")
  assert wire["environment"] == exact and wire["patch"] == "P" and "image_name" not in wire
  assert "environment" not in got["pallets__click-3"].sandbox_dict()
  said = capsys.readouterr().out
  assert "2 from the registry, 1 from the records, 1 with none" in said
  assert "without an environment: pallets/click" in said and "image_name (1)" in said
  assert "acme/own, pallets/click" in said and "psf/requests" not in said.split("repositories not under")[1]


def test_bad_inputs_name_the_problem(tmp_path, capsys):
  tasks = tmp_path / "tasks.jsonl"
  rec = _record(1, "psf/requests", "2.31")
  del rec["base_commit"]
  tasks.write_text(json.dumps(rec) + "\n")
  assert import_swe.main(["--tasks", str(tasks), "--out", str(tmp_path / "o.jsonl")]) == 2
  assert "missing required key(s) ['base_commit']" in capsys.readouterr().err
  tasks.write_text(json.dumps(_record(1, "psf/requests", "2.31")) + "\n")
  registry = tmp_path / "envs.json"
  registry.write_text(json.dumps({"psf/requests": {"python": PY, "requirements": ["idna"]}}))
  assert import_swe.main(["--tasks", str(tasks), "--environments", str(registry),
                          "--out", str(tmp_path / "o.jsonl")]) == 2
  assert "psf/requests: environment.requirements: 'idna' is not an exact pin" in capsys.readouterr().err
  registry.write_text(json.dumps({"requests": {"python": PY}}))
  assert import_swe.main(["--tasks", str(tasks), "--environments", str(registry),
                          "--out", str(tmp_path / "o.jsonl")]) == 2
  assert "'requests' is not 'owner/name'" in capsys.readouterr().err
  bad_env = dict(_record(1, "psf/requests", "2.31"), environment={"python": "2.7"})
  with pytest.raises(ValueError, match="environment.python: 2.7 is older than 3.11"):
    swe.SweTask.from_dict(bad_env, "t.jsonl:1")
  assert not (tmp_path / "o.jsonl").exists()                          # nothing half-written


def test_tasks_outside_the_manifest_need_their_repository(tmp_path):
  repos_dir = tmp_path / "repos"
  root = repos_dir / "acme__own"
  root.mkdir(parents=True)
  git = lambda *a: subprocess.run(["git", "-C", str(root), *a], check=True, capture_output=True,
                                  text=True).stdout.strip()
  git("init", "-q")
  (root / "m.py").write_text("x = 1\n")
  git("add", "-A")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
  base = git("rev-parse", "HEAD")
  task = dict(_record(1, "acme/own", "1"), base_commit=base)
  assert repos.ensure_repos([], [task], str(repos_dir)) == {}           # checked, nothing built
  with pytest.raises(ValueError, match="base_commit f{40} is not a commit of"):
    repos.ensure_repos([], [dict(task, base_commit="f" * 40)], str(repos_dir))
  with pytest.raises(ValueError, match="no git repository at .*acme__gone .clone it there"):
    repos.ensure_repos([], [dict(task, repo="acme/gone")], str(repos_dir))

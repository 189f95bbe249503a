"""Per-task test environments (issue 22 item 1): a venv built from PyPI pins, once per spec,
mounted read-only; the tests run with its Python and nothing of the executor's own venv.

The real builds download small pure-Python wheels (pytest's own and wcwidth, which dockyard's
stack does not have) from the configured index: ~10-20 s the first time, cached by pip after.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

from dockyard.sandbox import environments
from dockyard.sandbox import synthetic as rf
from dockyard.sandbox.environments import EnvironmentSpecError, parse_spec
from dockyard.sandbox.executor import Executor, Limits
from dockyard.sandbox.sessions import SessionError, SessionManager
from dockyard.sandbox.task import TaskError

SESSION_LOOP = pytest.mark.asyncio(loop_scope="session")   # the executor's views live on it
PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
SPEC = {"name": "width", "python": PY, "requirements": ["wcwidth==0.2.13"],
        "pytest_args": ["-p", "no:warnings"]}
REPO = "acme/width"
CORE_BUGGY = "from wcwidth import wcswidth  # noqa: F401\n\n\ndef display_width(s):\n  return len(s)\n"
CORE_FIXED = "from wcwidth import wcswidth\n\n\ndef display_width(s):\n  return wcswidth(s)\n"


def _test_file(host_prefix: str, env_prefix: str) -> str:
  return textwrap.dedent(f"""\
      import os
      import sys

      from width.core import display_width


      def test_wide():
        assert display_width("\\u30b3\\u30f3\\u30cb\\u30c1\\u30cf") == 10


      def test_ascii():
        assert display_width("abc") == 3


      def test_isolated():
        # the environment's Python, and nothing of the executor's venv is mounted
        assert sys.prefix == {env_prefix!r}, sys.prefix
        assert not os.path.exists({host_prefix!r})
        import pytest
        assert pytest.__file__.startswith({env_prefix!r})
      """)


@pytest.fixture(scope="module")
async def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("envs")
  repos, cache = root / "repos", root / "cache"
  repos.mkdir()
  executor = Executor(repos_dir=str(repos), cache_dir=str(cache), slots=2,
                      limits=Limits(timeout_s=60.0, cpu_time_s=30, memory_mb=2048))
  env_prefix = executor.envs.path(parse_spec(SPEC))
  git_root = repos / REPO.replace("/", "__")
  git_root.mkdir()
  (git_root / "width").mkdir()
  (git_root / "width" / "__init__.py").write_text("")
  (git_root / "width" / "core.py").write_text(CORE_BUGGY)
  (git_root / "tests").mkdir()
  (git_root / "tests" / "__init__.py").write_text("")
  rf._git(str(git_root), "init", "-q")
  rf._git(str(git_root), "add", "-A")
  rf._git(str(git_root), "commit", "-qm", "base")
  base = rf._git(str(git_root), "rev-parse", "HEAD")
  task = dict(instance_id="acme__width-1", repo=REPO, base_commit=base,
              patch=rf.diff("width/core.py", CORE_BUGGY, CORE_FIXED),
              test_patch=rf.diff("tests/test_width.py", None, _test_file(sys.prefix, env_prefix)),
              FAIL_TO_PASS=["tests/test_width.py::test_wide"],
              PASS_TO_PASS=["tests/test_width.py::test_ascii", "tests/test_width.py::test_isolated"],
              environment=SPEC)
  yield dict(executor=executor, task=task, env_prefix=env_prefix, repos=str(repos), cache=str(cache),
             root=root)
  await executor.close()   # the spare views


def test_spec_checks_name_the_field():
  for bad, match in [
      ({"python": PY, "requirements": ["wcwidth>=0.2"]}, "not an exact pin"),
      ({"python": PY, "requirements": ["wcwidth==0.2.*"]}, "not an exact pin"),
      ({"python": PY, "requirements": ["wcwidth==0.2.13", "WCWidth==0.2.12"]}, "pinned twice"),
      ({"python": PY, "requirements": ["pytest==6.2.5"]}, "older than 7.0"),
      ({"python": "3.8", "requirements": []}, "older than 3.11"),
      ({"python": "three", "requirements": []}, "environment.python"),
      ({"python": PY, "requirments": []}, "unknown key"),
      ({"python": PY, "pytest_args": "-x"}, "pytest_args"),
      ("wcwidth", "expected an object")]:
    with pytest.raises(EnvironmentSpecError, match=match):
      parse_spec(bad)
  spec = parse_spec({"python": PY, "requirements": ["b==1", "a==2"]})
  assert any(r.startswith("pytest==") for r in spec.requirements)      # the executor's pytest
  assert spec.key == parse_spec({"python": PY, "requirements": ["a==2", "b==1"], "name": "x"}).key
  assert spec.key != parse_spec({"python": PY, "requirements": ["a==2", "b==2"]}).key


@SESSION_LOOP
async def test_a_bad_environment_record_is_a_task_error(setup):
  with pytest.raises(TaskError, match="environment.requirements"):
    await setup["executor"].run(dict(setup["task"], environment={"python": PY, "requirements": ["x"]}))


@SESSION_LOOP
async def test_graded_in_the_environment_built_once(setup):
  executor, task = setup["executor"], setup["task"]
  # Gold and a wrong patch at once: one build between them (the second waits for the first).
  gold, wrong = await asyncio.gather(
      executor.run(task),
      executor.run(dict(task, instance_id="wrong", patch=rf.diff(
          "width/core.py", CORE_BUGGY, CORE_BUGGY.replace("len(s)", "len(s) + 0")))))
  assert executor.envs.builds == 1
  assert gold["resolved"] and gold["reward"] == 1.0, gold
  assert gold["tests_status"]["tests/test_width.py::test_isolated"] == "PASSED"
  assert not wrong["resolved"] and wrong["tests_status"]["tests/test_width.py::test_wide"] == "FAILED"
  assert wrong["tests_status"]["tests/test_width.py::test_isolated"] == "PASSED", wrong
  info = json.load(open(os.path.join(setup["env_prefix"], "env.json")))
  assert any(line.startswith("wcwidth==0.2.13") for line in info["freeze"])
  assert not any(line.lower().startswith(("jax", "vllm", "torch")) for line in info["freeze"])
  again = await executor.run(task)
  assert again["resolved"] and executor.envs.builds == 1     # cached: no second build


@SESSION_LOOP
async def test_without_its_environment_the_task_cannot_pass(setup):
  """The same task on the executor's own Python: wcwidth is not there, nothing passes."""
  task = {k: v for k, v in setup["task"].items() if k != "environment"}
  verdict = await setup["executor"].run(task)
  assert not verdict["resolved"] and verdict["patch_applied"], verdict
  assert verdict["tests_status"].get("tests/test_width.py::test_wide") != "PASSED"


@SESSION_LOOP
async def test_a_failed_build_is_an_environment_error_not_a_wrong_patch(setup):
  executor = setup["executor"]
  spec = dict(SPEC, requirements=["dockyard-no-such-package-zz==1.0"])
  verdict = await executor.run(dict(setup["task"], environment=spec))
  assert not verdict["resolved"] and verdict["findings"] == ["environment_error"], verdict
  assert verdict["reason"].startswith("environment: width") and "pip" in verdict["reason"]
  assert not os.path.exists(executor.envs.path(parse_spec(spec)))   # no half-built venv left
  builds = executor.envs.builds
  again = await executor.run(dict(setup["task"], environment=spec))
  assert again["reason"] == verdict["reason"] and executor.envs.builds == builds  # remembered
  missing = await executor.run(dict(setup["task"], environment=dict(SPEC, python="3.99")))
  assert missing["findings"] == ["environment_error"] and "no Python 3.99" in missing["reason"]


@SESSION_LOOP
async def test_a_session_acts_in_the_environment(setup):
  manager = SessionManager(setup["executor"])
  opened = await manager.create(dict(setup["task"], patch=""))
  try:
    run = await manager.exec(opened["id"], "python -c 'import sys, wcwidth; print(sys.prefix)'")
    assert run["exit_code"] == 0 and run["stdout"].strip() == setup["env_prefix"], run
    tool = await manager.tool(opened["id"], "view", {"path": "width/core.py"})
    assert "display_width" in tool["output"], tool
  finally:
    await manager.close(opened["id"], "test over")
  with pytest.raises(SessionError, match="environment: .*no Python 3.99"):
    await manager.create(dict(setup["task"], patch="", environment=dict(SPEC, python="3.99")))


def test_find_python_names_where_it_looked():
  assert os.path.samefile(environments.find_python(PY), os.path.realpath(sys.executable))
  with pytest.raises(environments.EnvironmentBuildError, match="python3.99 on PATH"):
    environments.find_python("3.99")
  out = subprocess.run([environments.find_python(PY), "-c", "import sys; print(sys.version_info[:2])"],
                       capture_output=True, text=True, check=True).stdout
  assert out.strip() == str(tuple(sys.version_info[:2]))


@SESSION_LOOP
async def test_mined_tasks_validate_in_their_environment(setup):
  """Items 3 + 4 together: a history whose tests need wcwidth, mined with `--environment` (the
  tests run in the venv the sandbox grades in), then validated through the real executor."""
  from dockyard.data import mine, swe, validate_swe
  src = setup["root"] / "src"
  src.mkdir()
  git = lambda *a: rf._git(str(src), *a)
  git("init", "-q")
  (src / "width").mkdir()
  (src / "width" / "__init__.py").write_text("")
  (src / "width" / "core.py").write_text(CORE_BUGGY)
  (src / "tests").mkdir()
  (src / "tests" / "test_width.py").write_text(
      "from width.core import display_width\n\n\ndef test_ascii():\n  assert display_width('ab') == 2\n")
  git("add", "-A")
  git("commit", "-qm", "width: first version")
  (src / "width" / "core.py").write_text(CORE_FIXED)
  (src / "tests" / "test_width.py").write_text(
      (src / "tests" / "test_width.py").read_text()
      + "\n\ndef test_wide():\n  assert display_width('\u30b3\u30f3') == 4\n")
  git("commit", "-qam", "width: count East Asian wide characters as 2")
  spec_file = setup["root"] / "env.json"
  spec_file.write_text(json.dumps(SPEC))
  out = setup["root"] / "mined.jsonl"
  executor = setup["executor"]
  builds = executor.envs.builds
  assert mine.main(["--repo", str(src), "--name", "acme/mined", "--repos_dir", setup["repos"],
                    "--out", str(out), "--environment", str(spec_file), "--cache_dir", setup["cache"]]) == 0
  (task,) = swe.load_tasks(str(out))
  assert task.FAIL_TO_PASS == ["tests/test_width.py::test_wide"], task
  assert task.PASS_TO_PASS == ["tests/test_width.py::test_ascii"] and task.environment == SPEC

  class Local:   # the executor in-process as validate_swe's client
    async def run(self, task):
      return await executor.run(task)

  (check,) = await validate_swe.check_tasks(Local(), [task], repeats=2)
  assert check.ok and (check.gold_resolved, check.empty_resolved) == (2, 0), check
  assert executor.envs.builds == builds      # the venv mining used is the one grading used

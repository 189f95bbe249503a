"""Terminal tasks in real sandbox sessions (bubblewrap, the executor's session path): every generated
task's oracle passes its checker and doing nothing fails it; an adversarial agent (a fake checker in
its directory, writes outside it, hunting for the checker) does not pass; bad specs and failing
setups are clear 422s; through the server, TerminalEnv's session submit returns the checker's
verdict and an agent episode of the oracle's calls earns reward 1."""
import asyncio
import json

import pytest
import transformers

from dockyard.agent.episode import AgentConfig, SessionExecutor, run_episode
from dockyard.agent.tools import SESSION_TOOLS, parse_call
from dockyard.agent.trajectory import ChatRenderer
from dockyard.data import terminal
from dockyard.agent.envs import TerminalEnv, oracle_calls, oracle_turns
from dockyard.models import tiny
from dockyard.rollout.base import SamplingParams
from dockyard.sandbox.client import SandboxClient, SessionLost
from dockyard.sandbox.sessions import SessionError, SessionManager
from tests.agent.scripted import ScriptedGenerator

session_loop = pytest.mark.asyncio(loop_scope="session")

TASKS = terminal.make_tasks(seed=0, per_family=24)
SECRET = "dockyard-checker-secret-7f3a"
# A task whose checker holds a marker the agent must never find, and wants out.txt to say "done".
GUARDED = {"instance_id": "guarded", "kind": "terminal", "files": {"in.txt": "x\n"}, "setup": "",
           "check": f"# {SECRET}\ntest \"$(cat out.txt)\" = done"}


@session_loop
async def test_every_generated_task_oracle_passes_and_doing_nothing_fails(executor):
  manager = SessionManager(executor)
  slots = asyncio.Semaphore(4)
  failures = []

  async def one(task):
    async with slots:
      sid = (await manager.create(task))["id"]
      try:
        before = await manager.check(sid)              # the starting directory, untouched
        runs = [await manager.exec(sid, c) for c in task["oracle"]]
        after = await manager.check(sid)
      finally:
        await manager.close(sid, "validated")
      if before["passed"] or not after["passed"]:
        failures.append((task["instance_id"], before, after, runs))

  await asyncio.gather(*(one(t) for t in TASKS))
  assert not failures, failures[:3]


def test_the_task_set_is_generated_deterministically_and_split_by_family():
  assert len(TASKS) >= 100 and {t["family"] for t in TASKS} == set(terminal.FAMILIES)
  assert terminal.make_tasks(seed=0, per_family=24) == TASKS
  assert terminal.make_tasks(seed=1, per_family=24) != TASKS
  assert len({t["instance_id"] for t in TASKS}) == len(TASKS)
  assert len({t["instruction"] + json.dumps(t["files"]) for t in TASKS}) > 0.9 * len(TASKS)
  train, held = terminal.split(TASKS, ("files", "text", "scripts"), ("git", "archives"))
  assert {t["family"] for t in train} == {"files", "text", "scripts"}
  assert {t["family"] for t in held} == {"git", "archives"} and len(train) + len(held) == len(TASKS)
  with pytest.raises(ValueError, match="both the train and the held-out"):
    terminal.split(TASKS, ("git",), ("git",))
  with pytest.raises(ValueError, match="unknown"):
    terminal.make_tasks(families=("nope",))


@session_loop
async def test_an_adversarial_agent_cannot_fake_or_find_the_checker(executor):
  manager = SessionManager(executor)
  sid = (await manager.create(GUARDED))["id"]
  # everywhere the executor could have put it: the tree, scratch space, its own mounts, processes
  hunt = await manager.exec(sid, f"grep -rsl {SECRET} /testbed /tmp /home /dockyard /proc/*/cmdline "
                                 "/proc/*/environ; ls -a /testbed /dockyard")
  assert SECRET not in hunt["stdout"] and "in.txt" in hunt["stdout"], hunt
  attacks = ("printf '#!/bin/sh\\nexit 0\\n' > check.sh; chmod +x check.sh; cp check.sh run-tests.sh; "
             "echo done > /tmp/out.txt; echo done > $HOME/out.txt; ln -s /tmp/out.txt link.txt; "
             "echo done > /usr/bin/out.txt; echo 'exit 0' >> /bin/test; "
             "mkdir -p .git/hooks; (sleep 30; echo done > out.txt) & disown; setsid sleep 30 &")
  await manager.exec(sid, attacks)
  verdict = await manager.check(sid)
  assert not verdict["passed"] and verdict["reward"] == 0.0, verdict
  assert (await manager.exec(sid, "cat check.sh && ls /tmp /home/sandbox | wc -l"))["stdout"].startswith("#!/bin/sh")
  await manager.exec(sid, "echo done > out.txt")
  assert (await manager.check(sid))["passed"]   # the same checker passes the honest answer
  await manager.close(sid, "done")


@session_loop
async def test_bad_terminal_specs_and_failing_setups_are_clear_errors(executor):
  manager = SessionManager(executor)
  for files, match in (({"../up.txt": "x"}, "not a relative path"), ({"/abs": "x"}, "not a relative path"),
                       ({".git/config": "x"}, "top-level .git"), ({"a": 3}, "files: expected")):
    with pytest.raises(SessionError, match=match) as e:
      await manager.create(dict(GUARDED, files=files))
    assert e.value.status == 422
  with pytest.raises(SessionError, match="check: expected a non-empty") as e:
    await manager.create(dict(GUARDED, check="  "))
  with pytest.raises(SessionError, match="setup: failed") as e:
    await manager.create(dict(GUARDED, setup="echo nope >&2; exit 4"))
  assert "nope" in str(e.value) and not manager.sessions
  sid = (await manager.create(GUARDED))["id"]
  with pytest.raises(SessionError, match="no base to diff") as e:
    await manager.diff(sid)
  await manager.close(sid, "done")


@session_loop
async def test_submit_through_the_server_returns_the_checker_verdict(server):
  task = next(t for t in TASKS if t["family"] == "git")
  async with SandboxClient([server.url]) as client:
    env = TerminalEnv(client)
    s = await env.open_session(task)
    assert (await s.exec("git log --oneline | wc -l"))["exit_code"] == 0
    verdict = await s.submit()
    assert verdict["kind"] == "terminal" and verdict["reward"] == 0.0 and not verdict["passed"]
    with pytest.raises(SessionLost, match="submitted; checked: reward 0"):
      await s.exec("true")
    # single-shot scoring (validation): the oracle's calls as one completion pass, nothing fails
    assert (await env.score(task, env.gold_completion(task))).value == 1.0
    empty = await env.score(task, "I would run git.")
    assert empty.malformed and empty.value == 0.0


@session_loop
async def test_an_episode_of_the_oracle_turns_earns_the_checker_reward(server):
  task = next(t for t in TASKS if t["template"] == "archives_extract")
  calls = oracle_calls(task)
  assert [parse_call(turn, SESSION_TOOLS) for turn in oracle_turns(task)] == calls
  assert calls[-1].name == "submit" and len(calls) == len(task["oracle"]) + 1
  tok = transformers.AutoTokenizer.from_pretrained(tiny.make_tiny_model())
  turns = oracle_turns(task)
  gen = ScriptedGenerator(tok, lambda prompt: turns[prompt.count("<|im_start|>tool")])
  async with SandboxClient([server.url]) as client:
    env = TerminalEnv(client)
    executor = SessionExecutor(await env.open_session(task))
    try:
      ep = await run_episode(gen, executor, ChatRenderer(tok, SESSION_TOOLS), task,
                             env.prompt_messages(task), SamplingParams(),
                             AgentConfig(command_timeout_s=5.0, max_context_tokens=8192))
    finally:
      await executor.close()
  assert ep.ending == "submitted" and ep.reward.value == 1.0, (ep.ending, ep.reward, ep.messages)
  assert ep.reward.info["verdict"]["passed"]

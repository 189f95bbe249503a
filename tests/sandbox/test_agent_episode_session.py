"""An agent episode against a real sandbox session: a scripted model views, makes a failing edit
(the tool's error comes back as its result), fixes the bug, runs the tests, runs past the command budget and submits; the
verdict from a fresh checkout is the reward, and the trajectory matches the chat template's
one-go render."""
import json

import pytest
import transformers

from dockyard.agent.episode import AgentConfig, SessionExecutor, episode_metrics, run_group
from dockyard.agent.tools import SESSION_TOOLS
from dockyard.agent.trajectory import ChatRenderer, check_against_template
from dockyard.models import tiny
from dockyard.rollout.base import SamplingParams
from dockyard.sandbox import synthetic as rf
from dockyard.sandbox.client import SandboxClient
from tests.agent.scripted import ScriptedGenerator
from tests.sandbox.session_helpers import FIX

pytestmark = pytest.mark.asyncio(loop_scope="session")


def tool_call(name, **arguments):
  return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


TURNS = [tool_call("view", path="calc/core.py"),
         tool_call("edit", path="calc/core.py", old_str="return a * b", new_str="x"),
         tool_call("edit", **FIX),
         tool_call("bash", command="python -m pytest -q -p no:cacheprovider tests", timeout=20),
         tool_call("bash", command="sleep 8", timeout=20),
         tool_call("submit")]


async def test_a_scripted_agent_fixes_the_repo_in_a_session(server, workspace):
  tok = transformers.AutoTokenizer.from_pretrained(tiny.make_tiny_model())
  gen = ScriptedGenerator(tok, lambda prompt: TURNS[prompt.count("<|im_start|>tool")])
  renderer = ChatRenderer(tok, SESSION_TOOLS)
  task = rf.task(workspace["base"], "", instance_id="agent-episode")
  first = [{"role": "user", "content": "calc.add is wrong; fix it and submit."}]
  async with SandboxClient([server.url]) as client:
    async def open_executor(t):
      return SessionExecutor(await client.open_session(t))
    episodes = await run_group(gen, open_executor, renderer, task, first, 2, SamplingParams(),
                               AgentConfig(command_timeout_s=4.0, max_context_tokens=8192))
  for ep in episodes:
    assert ep.ending == "submitted" and ep.reward.value == 1.0, (ep.ending, ep.reward, ep.messages)
    assert ep.reward.info["verdict"]["resolved"] and ep.tool_errors == 1
    results = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert "def add(a, b):" in results[0]
    assert results[1].startswith("error: ") and "not found" in results[1]
    assert results[3].startswith("exit code: 0") and "passed" in results[3]
    assert results[4] == "timed out after 4 s"   # it asked for 20 s; the command budget is 4
    assert check_against_template(renderer, ep.messages, ep.trajectory) is None
  m = episode_metrics(episodes)
  assert m["agent/turns"] == 6 and m["agent/calls/edit"] == 2 and m["agent/ending/submitted"] == 1
  assert m["agent/env_s"] > 0


async def test_episode_groups_play_in_sessions_the_swe_env_opens(server, workspace):
  """The GRPO sources' default: each episode in a session `SweEnv.open_session` opens."""
  import ml_collections

  from dockyard.envs.swe import SweEnv
  from dockyard.grpo.episodes import EpisodeGroups
  tok = transformers.AutoTokenizer.from_pretrained(tiny.make_tiny_model())
  gen = ScriptedGenerator(tok, lambda prompt: [TURNS[2], TURNS[-1]][prompt.count("<|im_start|>tool")])
  config = ml_collections.ConfigDict(dict(
      agent=dict(max_turns=4, max_context_tokens=8192), grpo=dict(num_generations_per_prompt=2),
      env=dict()))
  task = dict(rf.task(workspace["base"], "", instance_id="agent-group"),
              problem_statement="calc.add subtracts; make it add.")
  env = SweEnv(SandboxClient([server.url]), count_tokens=lambda s: len(tok.encode(s)),
               repos_dir=workspace["repos"])
  try:
    group = await EpisodeGroups(config, generator=gen, env=env, tokenizer=tok).group(task, SamplingParams())
  finally:
    await env.close()
  assert [r.value for r in group.rewards] == [1.0, 1.0]
  assert all(r.info["verdict"]["resolved"] for r in group.rewards)
  assert all(0 < sum(c.loss_mask) < len(c.token_ids) for c in group.completions)


async def test_the_swe_agent_oracle_resolves_its_task_in_a_session(server, workspace):
  """SweAgentEnv's oracle (view + edit from the gold patch, then submit), played by the SFT warm
  start's OracleGenerator in a real session: resolved, the trajectory token-exact; a task whose
  gold patch does not fix it is reported, not kept."""
  from dockyard.agent.envs import SweAgentEnv
  from dockyard.agent.oracle import play_oracle
  tok = transformers.AutoTokenizer.from_pretrained(tiny.make_tiny_model())
  renderer = ChatRenderer(tok, SESSION_TOOLS)
  env = SweAgentEnv(SandboxClient([server.url]), count_tokens=lambda s: len(tok.encode(s)),
                    repos_dir=workspace["repos"])
  good = dict(rf.task(workspace["base"], rf.gold_patch(), instance_id="oracle-good"),
              problem_statement="calc.add subtracts; make it add.")
  wrong = dict(good, instance_id="oracle-wrong", patch=rf.src_patch(
      rf.CORE_BUGGY.replace("return a - b\n\n\ndef sub", "return a * b\n\n\ndef sub")))

  async def open_executor(t):
    return SessionExecutor(await env.open_session(t))
  try:
    played, failed = await play_oracle(env, tok, [good, wrong], renderer,
                                       AgentConfig(max_turns=4, max_context_tokens=8192),
                                       open_executor, max_tokens=256)
  finally:
    await env.close()
  assert failed == ["oracle-wrong"] and len(played) == 1
  ep = played[0]
  assert ep.ending == "submitted" and ep.reward.info["verdict"]["resolved"], ep.messages
  assert ep.tool_counts == {"view": 1, "edit": 1, "submit": 1} and ep.tool_errors == 0
  results = [m["content"] for m in ep.messages if m["role"] == "tool"]
  assert "def add(a, b):" in results[0] and not results[1].startswith("error")
  assert check_against_template(renderer, ep.messages, ep.trajectory) is None

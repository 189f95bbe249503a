"""The episode loop with a scripted model and an in-memory tool executor: stop strings, bad calls
as tool results with their penalty, each budget and how truncation is masked or penalized,
unstable templates masked and counted, many episodes on one event loop."""
import asyncio
import copy
import json

import pytest

from dockyard.agent.episode import (AgentConfig, Episode, ToolExecutor, ToolResult, episode_metrics,
                                    run_episode, run_group)
from dockyard.agent.tools import SESSION_TOOLS
from dockyard.agent.trajectory import ChatRenderer, check_against_template
from dockyard.envs.base import Reward
from dockyard.rollout.base import SamplingParams
from tests.agent.scripted import ScriptedGenerator

TASK = {"instance_id": "t0"}
FIRST = [{"role": "user", "content": "Make ok.txt say yes, then submit."}]
SAMPLING = SamplingParams(temperature=1.0, max_tokens=200)


def tool_call(name, **arguments):
  return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


class FilesExecutor(ToolExecutor):
  """Tools over a dict of files; the reward is whether ok.txt says yes."""
  tools = SESSION_TOOLS

  def __init__(self, command_s: float = 0.0):
    self.files, self.calls, self.command_s, self.closed = {}, [], command_s, False

  async def call(self, call, timeout_s):
    self.calls.append((call.name, call.arguments, timeout_s))
    if call.name == "bash":
      await asyncio.sleep(min(self.command_s, timeout_s))
      return ToolResult("exit code: 0\nstdout:\n" + " ".join(sorted(self.files)) + "\n")
    if call.name == "create":
      self.files[call.arguments["path"]] = call.arguments["content"]
      return ToolResult(f"wrote {call.arguments['path']}")
    if call.name == "view":
      if call.arguments["path"] not in self.files:
        return ToolResult(f"error: no such file {call.arguments['path']}", error=True)
      return ToolResult(self.files[call.arguments["path"]])
    raise AssertionError(call)

  async def finish(self):
    return Reward(float(self.files.get("ok.txt") == "yes"))

  async def close(self):
    self.closed = True


def script(*turns):
  """A model that says turns[k] as its k-th turn (k = tool results seen so far)."""
  return lambda prompt: turns[min(prompt.count("<|im_start|>tool"), len(turns) - 1)]


def play(tokenizer, respond, config=AgentConfig(), executor=None, sampling=SAMPLING, renderer=None):
  executor = executor or FilesExecutor()
  gen = ScriptedGenerator(tokenizer, respond)
  renderer = renderer or ChatRenderer(tokenizer, executor.tools)
  ep = asyncio.run(run_episode(gen, executor, renderer, TASK, FIRST, sampling, config))
  return ep, gen, executor, renderer


def test_a_solved_episode_is_token_exact_and_stops_at_each_call(tokenizer):
  respond = script(tool_call("view", path="ok.txt") + "\n<|im_end|>\n<|im_start|>tool\nyes (made up)",
                   tool_call("create", path="ok.txt", content="yes"),
                   tool_call("submit"))
  ep, gen, executor, renderer = play(tokenizer, respond)
  assert ep.ending == "submitted" and ep.reward.value == 1.0 and ep.turns == 3
  assert ep.tool_counts == {"view": 1, "create": 1, "submit": 1} and ep.tool_errors == 1
  assert all(s.stop == ("</tool_call>",) for _, s in gen.requests)
  # generation stopped at the call: the model's made-up tool result is not in the trajectory
  assert "made up" not in tokenizer.decode(ep.trajectory.ids)
  assert ep.messages[2] == {"role": "tool", "content": "error: no such file ok.txt"}
  # each request is the trajectory so far, token for token
  t = ep.trajectory
  for (prompt, _), (start, _) in zip(gen.requests, t.generated):
    assert prompt == t.prompt_ids + t.token_ids[:start]
  assert sum(t.loss_mask) == sum(e - s for s, e in t.generated) > 0 and not ep.masked
  assert check_against_template(renderer, ep.messages, t) is None


def test_bad_calls_go_back_to_the_agent_and_are_penalized(tiny_tokenizer):
  respond = script('<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>',
                   tool_call("rm", path="/"), tool_call("create", path="ok.txt"),
                   tool_call("create", path="ok.txt", content="yes"), tool_call("submit"))
  ep, _, executor, _ = play(tiny_tokenizer, respond, AgentConfig(invalid_action_penalty=0.25))
  assert ep.invalid_calls == 3 and ep.ending == "submitted"
  assert ep.reward.value == pytest.approx(1.0 - 0.75) and ep.reward.info["raw_reward"] == 1.0
  results = [m["content"] for m in ep.messages if m["role"] == "tool"]
  assert "not valid JSON" in results[0] and "unknown tool 'rm'" in results[1]
  assert "'content' is a required property" in results[2]
  assert [c[0] for c in executor.calls] == ["create"]   # bad calls never reach the executor
  m = episode_metrics([ep])
  assert m["agent/invalid_call_rate"] == pytest.approx(3 / 5) and m["agent/calls/create"] == 1


def test_an_answer_without_a_call_ends_the_episode(tiny_tokenizer):
  ep, _, _, renderer = play(tiny_tokenizer, script("I cannot do that."))
  assert ep.ending == "answered" and ep.turns == 1 and ep.reward.value == 0.0 and not ep.truncated
  assert ep.trajectory.token_ids[-1] == tiny_tokenizer.eos_token_id
  assert check_against_template(renderer, ep.messages, ep.trajectory) is None


def test_max_turns_masks_or_penalizes(tiny_tokenizer):
  respond = script(tool_call("bash", command="ls"))
  ep, _, executor, _ = play(tiny_tokenizer, respond, AgentConfig(max_turns=3, warn_turns_left=1))
  assert ep.ending == "max_turns" and ep.turns == 3 and len(executor.calls) == 3
  assert ep.truncated and ep.masked and sum(ep.trajectory.loss_mask) == 0
  assert ep.messages[-2]["content"].endswith("[1 turns left]")   # warned before the last turn
  ep, _, _, _ = play(tiny_tokenizer, respond, AgentConfig(max_turns=3, truncation="penalize",
                                                         truncation_penalty=0.5))
  assert not ep.masked and sum(ep.trajectory.loss_mask) > 0 and ep.reward.value == -0.5


def test_context_budget_caps_each_turn_and_ends_the_episode(tiny_tokenizer):
  respond = script(tool_call("bash", command="ls " + "x" * 40))
  prompt = ChatRenderer(tiny_tokenizer, SESSION_TOOLS).ids(FIRST, add_generation_prompt=True)
  cap = len(prompt) + 250   # room for a few turns
  ep, gen, _, _ = play(tiny_tokenizer, respond, AgentConfig(max_context_tokens=cap))
  assert ep.ending == "max_context_tokens" and ep.masked and len(ep.trajectory) <= cap
  assert ep.turns >= 2
  for prompt, s in gen.requests:   # each turn may use what is left of the context, no more
    assert s.max_tokens == min(SAMPLING.max_tokens, cap - len(prompt))
  assert gen.requests[-1][1].max_tokens < SAMPLING.max_tokens   # here the last turn was cut by it


def test_a_turn_cut_at_max_tokens_is_a_truncation(tiny_tokenizer):
  ep, _, _, _ = play(tiny_tokenizer, script("word " * 100), sampling=SamplingParams(max_tokens=16))
  assert ep.ending == "turn_max_tokens" and ep.masked and ep.turns == 1


def test_command_and_episode_time_budgets(tiny_tokenizer):
  respond = script(tool_call("bash", command="sleep 9", timeout=50))
  executor = FilesExecutor(command_s=0.2)
  ep, _, _, _ = play(tiny_tokenizer, respond, AgentConfig(command_timeout_s=0.3, episode_timeout_s=1.0),
                     executor=executor)
  assert ep.ending == "episode_timeout" and ep.masked
  assert all(timeout <= 0.3 for _, _, timeout in executor.calls) and 3 <= len(executor.calls) <= 6


def test_an_unstable_template_is_masked_and_counted(tiny_tokenizer):
  tok = copy.deepcopy(tiny_tokenizer)
  tok.chat_template = ("<|im_start|>system\n{{ messages|length }} messages<|im_end|>\n"
                       + tiny_tokenizer.chat_template)
  ep, _, _, _ = play(tok, script(tool_call("bash", command="ls")), AgentConfig(truncation="penalize"))
  assert ep.ending == "template_unstable" and ep.masked and not ep.truncated
  assert sum(ep.trajectory.loss_mask) == 0
  assert episode_metrics([ep])["agent/template_unstable"] == 1.0


def test_many_episodes_share_one_event_loop(tiny_tokenizer):
  respond = script(tool_call("create", path="ok.txt", content="yes"), tool_call("submit"))
  gen = ScriptedGenerator(tiny_tokenizer, respond, delay_s=0.05)
  renderer = ChatRenderer(tiny_tokenizer, SESSION_TOOLS)
  executors = []

  async def open_executor(task):
    executors.append(FilesExecutor())
    return executors[-1]

  async def main():
    groups = [run_group(gen, open_executor, renderer, {"instance_id": f"t{i}"}, FIRST, 4, SAMPLING,
                        AgentConfig()) for i in range(4)]
    return await asyncio.gather(*groups)

  groups = asyncio.run(main())
  episodes = [e for g in groups for e in g]
  assert len(episodes) == 16 and all(isinstance(e, Episode) and e.reward.value == 1.0 for e in episodes)
  assert gen.max_in_flight == 16 and all(x.closed for x in executors)
  assert [g[0].task["instance_id"] for g in groups] == ["t0", "t1", "t2", "t3"]


def test_agent_config_errors_name_the_key():
  with pytest.raises(ValueError, match="agent.truncation must be one of"):
    AgentConfig(truncation="drop")
  with pytest.raises(ValueError, match="agent.max_turns must be >= 1"):
    AgentConfig(max_turns=0)
  with pytest.raises(ValueError, match=r"unknown keys \['max_turn'\]"):
    AgentConfig.from_config({"max_turn": 3})
  assert AgentConfig.from_config({"max_turns": 3}).max_turns == 3


def test_oracle_episodes_are_the_trajectories_an_sft_warm_start_trains_on(tokenizer):
  """`play_oracle`: each task's reference turns played as an episode; the trajectory is the
  template's rendering of the whole conversation (the turns trained, the tool results not), and an
  oracle that fails its grader is left out and named."""
  from dockyard.agent.oracle import play_oracle
  from dockyard.grpo.sft import pack_episodes

  class Env:
    def prompt_messages(self, task):
      return FIRST

    def oracle_turns(self, task):
      content = "yes" if task["instance_id"] != "bad" else "no"
      return [tool_call("create", path="ok.txt", content=content), tool_call("submit")]

    def is_success(self, reward):
      return reward.value >= 1.0

  async def open_executor(task):
    return FilesExecutor()
  renderer = ChatRenderer(tokenizer, SESSION_TOOLS)
  tasks = [{"instance_id": "a"}, {"instance_id": "bad"}, {"instance_id": "b"}]
  kept, failed = asyncio.run(play_oracle(Env(), tokenizer, tasks, renderer, AgentConfig(), open_executor,
                                         max_tokens=200, max_in_flight=2))
  assert [e.task["instance_id"] for e in kept] == ["a", "b"] and failed == ["bad"]
  ep = kept[0]
  assert ep.ending == "submitted" and ep.turns == 2 and ep.tool_counts == {"create": 1, "submit": 1}
  # token for token what the chat template renders for the conversation the episode had
  assert check_against_template(renderer, ep.messages, ep.trajectory) is None
  batch = pack_episodes(kept, pad_id=0)
  row = batch.input_ids[0][batch.loss_mask[0] > 0]
  trained = tokenizer.decode(row.tolist())
  assert '"create"' in trained and '"submit"' in trained and "wrote ok.txt" not in trained
  assert "wrote ok.txt" in tokenizer.decode(batch.input_ids[0][batch.attention_mask[0] > 0].tolist())

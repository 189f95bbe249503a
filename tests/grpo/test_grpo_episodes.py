"""Multi-turn episodes in the GRPO loops: rows with a loss mask over several generated segments
(single-shot rows unchanged), episodes as scored groups, and the sync and async loops training on
them through the same seams (a scripted model, tools over a dict, the JAX bigram policy)."""
import asyncio
import itertools
import json

import ml_collections
import numpy as np
import pytest

from dockyard import validate
from dockyard.agent.episode import ToolExecutor, ToolResult
from dockyard.envs.base import Reward
from dockyard.grpo import step
from dockyard.grpo.batch import Group, make_train_batch, pack_sequences
from dockyard.grpo.episodes import EpisodeGroups
from dockyard.grpo.source import SyncSource, make_source
from dockyard.rollout.base import Completion, SamplingParams
from tests.agent.scripted import ScriptedGenerator

from grpo_fakes import BigramPolicy, math_config, run_grpo

TASKS = [{"instance_id": f"t{i}", "question": f"task {i}"} for i in range(4)]


def tool_call(name, **arguments):
  return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_rows_train_only_where_the_completion_mask_says():
  episode = Completion(prompt_ids=[], token_ids=[8, 9, 30, 31, 10], logprobs=[-0.1, -0.2, 0, 0, -0.3],
                       finish_reason="stop", weight_version=0, loss_mask=[1, 1, 0, 0, 1])
  single = Completion(prompt_ids=[], token_ids=[8, 9], logprobs=[-0.1, -0.2], finish_reason="stop",
                      weight_version=0)
  b = make_train_batch([Group({"instance_id": "a"}, [5, 6], [episode, single],
                              advantages=np.array([1.0, -1.0]))], pad_id=0, pad_multiple=8)
  np.testing.assert_array_equal(b.loss_mask[0], [0, 0, 1, 1, 0, 0, 1, 0])
  np.testing.assert_array_equal(b.loss_mask[1], [0, 0, 1, 1, 0, 0, 0, 0])   # single-shot as before
  np.testing.assert_allclose(b.extras["generation_logprobs"][0], [0, 0, -0.1, -0.2, 0, 0, -0.3, 0],
                             rtol=1e-6)
  with pytest.raises(ValueError, match="row 0: a loss mask of 1 for 2 completion tokens"):
    pack_sequences([[1]], [[2, 3]], 0, completion_masks=[[1]])


class Env:
  """Prompts for the agent; the tools act on a dict (`Files`)."""

  def prompt_messages(self, task):
    return [{"role": "user", "content": f"{task['question']}: make ok.txt say yes, then submit."}]

  async def close(self):
    pass


class Files(ToolExecutor):
  from dockyard.agent.tools import SESSION_TOOLS as tools

  def __init__(self):
    self.files = {}

  async def call(self, call, timeout_s):
    self.files[call.arguments["path"]] = call.arguments["content"]
    return ToolResult("wrote it")

  async def finish(self):
    return Reward(float(self.files.get("ok.txt") == "yes"))


def agent_config(**over):
  config = math_config(**{"grpo.val_period": 0, "grpo.val_at_start": False, "grpo.max_num_steps": 2,
                     "rollout.max_new_tokens": 128, "rollout.max_model_len": 16384, **over})
  config.agent = ml_collections.ConfigDict(dict(max_turns=4, max_context_tokens=16384,
                                           invalid_action_penalty=0.5))
  validate.validate(config)
  return config


def scripted(tokenizer):
  """Half the episodes write yes, half no; every fourth makes a bad call first."""
  said = itertools.count()

  def respond(prompt):
    k = prompt.count("<|im_start|>tool")
    if k == 0:
      n = next(said)
      return ('<tool_call>{"name": "create"}</tool_call>' if n % 4 == 3 else
              tool_call("create", path="ok.txt", content="yes" if n % 2 else "no"))
    return tool_call("submit")
  return ScriptedGenerator(tokenizer, respond)


async def open_files(task):
  return Files()


def test_episodes_become_scored_groups_with_per_token_masks(tokenizer):
  config = agent_config()
  gen = scripted(tokenizer)
  episodes = EpisodeGroups(config, generator=gen, env=Env(), tokenizer=tokenizer, open_executor=open_files)
  assert episodes.slots._value == config.env.code.max_in_flight == 16
  episodes.slots = asyncio.Semaphore(12)
  source = SyncSource(config, generator=gen, env=Env(), tokenizer=tokenizer, train_tasks=TASKS, episodes=episodes)
  source.start("", 0, None)
  groups, metrics = source.take(1)
  source.close()
  n = config.grpo.num_generations_per_prompt
  assert len(groups) == config.grpo.num_prompts_per_step and all(g.size == n for g in groups)
  assert gen.max_in_flight == 12   # the slots bound the episodes alive at once, over the 4 groups
  assert metrics["agent/turns"] > 1 and metrics["agent/ending/submitted"] == 1.0
  values = sorted({r.value for g in groups for r in g.rewards})
  assert values == [-0.5, 0.0, 1.0]   # no; yes; a bad call (penalized), then a submit
  seeds = {s.seed for _, s in gen.requests}
  assert len(seeds) == len(gen.requests)   # every episode's every turn draws its own stream
  for g in groups:
    for c in g.completions:
      assert c.prompt_ids == g.prompt_ids and len(c.loss_mask) == len(c.token_ids) == len(c.logprobs)
      assert 0 < sum(c.loss_mask) < len(c.token_ids)
      assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.loss_mask) if not m)
      assert set(c.token_weight_versions) == {3}
  kept, _ = step.assign_advantages(groups, config)
  batch = make_train_batch(kept, tokenizer.pad_token_id, step.PAD_MULTIPLE)
  rows = [c for g in kept for c in g.completions]
  assert batch.loss_mask.sum() == sum(sum(c.loss_mask) for c in rows)
  row = rows[0]
  p = len(kept[0].prompt_ids)
  np.testing.assert_array_equal(batch.loss_mask[0, p:p + len(row.loss_mask)], row.loss_mask)


def test_validation_of_an_agent_config_plays_one_episode_per_task(tokenizer):
  """`run_validation` with an episode player: one episode per held-out task (not a single-shot
  completion for `env.score`), its reward and turns in the samples, success before penalties."""
  from dockyard.grpo.harness import run_validation

  class ValEnv(Env):
    def is_success(self, reward):
      return float(reward.info.get("raw_reward", reward.value)) >= 1.0

    def validation_metrics(self, rewards):
      return {"success_rate": sum(self.is_success(r) for r in rewards) / len(rewards)}

    async def score(self, task, completion):
      raise AssertionError("an agent config's validation plays episodes")

  config = agent_config()
  gen = scripted(tokenizer)
  episodes = EpisodeGroups(config, generator=gen, env=ValEnv(), tokenizer=tokenizer, open_executor=open_files)
  samples = []
  loop = asyncio.new_event_loop()
  try:
    val = run_validation(gen, ValEnv(), tokenizer, TASKS, SamplingParams(temperature=0.0, max_tokens=200),
                         loop, samples=samples, episodes=episodes)
  finally:
    loop.close()
  assert len(samples) == len(TASKS) and len(gen.requests) > len(TASKS)   # several turns per episode
  assert all("<tool_call>" in s["completion"] for s in samples)
  assert all(s["ending"] == "submitted" and s["tokens"] > 0 for s in samples), samples
  wins = sum(s["success"] for s in samples)
  assert 0 < wins < len(TASKS), samples
  assert val["val/success_rate"] == val["val/pass@1"] == wins / len(TASKS)
  assert episodes.metrics()["agent/turns"] > 1   # its own player's episodes


def test_eval_of_an_agent_config_plays_episodes(tokenizer, tmp_path, monkeypatch):
  """`run.mode=eval` on an agent config (dockyard.eval.evaluate): the greedy pass@1 and the sampled
  pass@k are over episodes played in sessions, never single completions for `env.score`."""
  from dockyard import eval as eval_lib

  class SessionEnv(Env):
    def is_success(self, reward):
      return float(reward.info.get("raw_reward", reward.value)) >= 1.0

    def validation_metrics(self, rewards):
      return {"success_rate": sum(self.is_success(r) for r in rewards) / len(rewards)}

    async def open_session(self, task):
      raise AssertionError("replaced by Files below")

    async def score(self, task, completion):
      raise AssertionError("an agent config's eval plays episodes")

  monkeypatch.setattr(EpisodeGroups, "_open_session", lambda self, task: open_files(task))
  config = agent_config(**{"eval.pass_k": 2, "eval.num_samples": 4})
  config.checkpoint.metric = "val/success_rate"
  gen = scripted(tokenizer)
  report = eval_lib.evaluate(config, generator=gen, env=SessionEnv(), tokenizer=tokenizer,
                             tasks=TASKS, workdir=str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / eval_lib.SAMPLES)]
  greedy = [r for r in rows if r["kind"] == "val_T0"]
  sampled = [r for r in rows if r["kind"] == "sample_T1"]
  assert len(greedy) == len(TASKS) and len(sampled) == 4 * len(TASKS)
  assert all("<tool_call>" in r["completion"] for r in greedy + sampled)
  assert len(gen.requests) > 5 * len(TASKS)   # a request per turn: several turns per episode
  wins = sum(r["success"] for r in greedy)
  assert 0 < wins < len(TASKS) and report["pass@1"] == report["rate"] == wins / len(TASKS)
  assert report["sampled"]["pass@1"] == pytest.approx(sum(r["success"] for r in sampled) / len(sampled))


def test_a_lost_session_replays_the_group_and_closes_every_executor(tokenizer):
  from dockyard.sandbox.client import SessionLost
  config = agent_config()
  made = []

  class Flaky(Files):
    closed = False

    async def call(self, call, timeout_s):
      if len(made) <= config.grpo.num_generations_per_prompt:   # the first group's attempt
        raise SessionLost("session s1 on http://x: the executor restarted")
      return await super().call(call, timeout_s)

    async def close(self):
      self.closed = True

  async def open_flaky(task):
    made.append(Flaky())
    return made[-1]

  episodes = EpisodeGroups(config, generator=scripted(tokenizer), env=Env(), tokenizer=tokenizer,
                           open_executor=open_flaky)
  group = asyncio.run(episodes.group(TASKS[0], SamplingParams(max_tokens=128, seed=1)))
  n = config.grpo.num_generations_per_prompt
  assert group.size == n and len(made) == 2 * n and all(x.closed for x in made)
  assert episodes.metrics()["agent/lost_groups"] == 1.0


def test_an_episode_out_of_time_before_its_first_turn_is_an_empty_row(tokenizer):
  config = agent_config()
  config.agent.episode_timeout_s = 0.05
  gen = scripted(tokenizer)
  gen.delay_s = 1.0
  episodes = EpisodeGroups(config, generator=gen, env=Env(), tokenizer=tokenizer, open_executor=open_files)
  group = asyncio.run(episodes.group(TASKS[0], SamplingParams(max_tokens=128)))
  assert all(c.token_ids == [] and c.weight_version == 3 and c.finish_reason == "length"
             for c in group.completions)
  assert episodes.metrics()["agent/ending/episode_timeout"] == 1.0
  group.advantages = np.zeros(group.size)
  assert make_train_batch([group], 0).loss_mask.sum() == 0


class SessionEnv(Env):
  """An env that opens sessions: the AgentSession calls SessionExecutor makes, over a dict."""

  class Session:
    info = {"max_timeout_s": 60.0}

    def __init__(self):
      self.files = {}

    async def tool(self, name, **args):
      assert name == "create", name
      self.files[args["path"]] = args["content"]
      return {"output": f"wrote {args['path']}"}

    async def submit(self):
      return {"reward": float(self.files.get("ok.txt") == "yes"), "resolved": True}

    async def close(self):
      pass

  async def open_session(self, task):
    return self.Session()


class NoWeights:
  """The synchronizer seam for a model whose weights never move (the scripted one)."""
  version = 0

  def refit(self):
    self.version += 1
    return {"version": self.version}


@pytest.mark.parametrize("async_grpo", [False, True], ids=["sync", "async"])
def test_both_loops_train_on_episodes(tokenizer, tmp_path, async_grpo):
  config = agent_config(**{"grpo.async_grpo.enabled": async_grpo})
  gen = scripted(tokenizer)
  policy = BigramPolicy(len(tokenizer), lr=0.05)
  env = SessionEnv()
  source = make_source(config, generator=gen, env=env, tokenizer=tokenizer, train_tasks=TASKS,
                       synchronizer=NoWeights())
  assert source.episodes is not None
  from dockyard import policy_factory
  from dockyard.grpo.loop import grpo_train
  result = grpo_train(config, source=source, policy=policy, generator=gen, synchronizer=NoWeights(), env=env,
                      tokenizer=tokenizer, train_tasks=TASKS, val_tasks=[], workdir=str(tmp_path),
                      losses=policy_factory.make_losses(config), progress=False)
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  trained = [r for r in rows if "train/tokens" in r]
  assert len(trained) == 2 and all(0 < r["train/tokens"] for r in trained)
  assert trained[0]["agent/turns"] >= 2 and trained[0]["agent/ending/submitted"] == 1.0
  # yes, no, no, a bad call (penalized 0.5) and a submit: 0.125 a task when the calls interleave evenly
  assert trained[0]["reward/raw_mean"] == pytest.approx(0.125, abs=0.2)
  assert result is not None


def test_validate_checks_the_agent_section():
  config = agent_config()
  config.agent.truncation = "drop"
  with pytest.raises(validate.ConfigError, match="agent: agent.truncation must be one of"):
    validate.validate(config)
  config = agent_config()
  config.agent.max_context_tokens = 20000
  with pytest.raises(validate.ConfigError, match=r"agent.max_context_tokens: .* <= rollout.max_model_len \(16384\)"):
    validate.validate(config)

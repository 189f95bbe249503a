"""configs/terminal.py and configs/swe_agent.py validate and build their parts: the agent section,
the terminal task set split by family, the agent envs' prompts; bad terminal sections are named."""
import pytest

from configs import swe_agent, terminal as terminal_config
from dockyard import plan, validate
from dockyard.agent.envs import SweAgentEnv, TerminalEnv
from dockyard.agent.episode import AgentConfig
from dockyard.data import terminal


@pytest.mark.parametrize("module", [swe_agent, terminal_config])
@pytest.mark.parametrize("arg", ["tiny", "full", "full,torch"])
def test_agent_configs_validate_and_plan(module, arg):
  config = module.get_config(arg)
  validate.validate(config)
  agent = AgentConfig.from_config(config.agent)
  assert agent.max_context_tokens <= config.rollout.max_model_len <= config.policy.max_seq_len
  assert "sandbox" in plan.make_plan(config).render()


def test_the_terminal_config_builds_its_split_task_set():
  t = terminal_config.get_config("tiny").env.terminal
  tasks = terminal.make_tasks(t.seed, t.tasks_per_family, tuple(t.train_families) + tuple(t.heldout_families))
  train, held = terminal.split(tasks, t.train_families, t.heldout_families)
  assert len(tasks) >= 100 and len(train) == 72 and len(held) == 48
  env = TerminalEnv(client=None)
  messages = env.prompt_messages(held[0])
  assert messages[-1]["content"] == held[0]["instruction"] and "/testbed" in messages[0]["content"]
  assert held[0]["check"] not in str(messages)


def test_heldout_fraction_holds_out_new_instances_of_every_template():
  tasks = terminal.make_tasks(0, 24, ("files", "git"))
  train, held = terminal.split(tasks, ("files",), ("git",), heldout_fraction=1 / 3)
  files_held = [t for t in held if t["family"] == "files"]
  assert len(train) == 16 and len(files_held) == 8 and len(held) == 8 + 24
  assert {t["instance_id"] for t in train}.isdisjoint(t["instance_id"] for t in held)
  # Every files template is trained on and held out, with different instances.
  assert {t["template"] for t in files_held} == {t["template"] for t in train} == {
      f.__name__.lstrip("_") for f in terminal.TEMPLATES["files"]}
  # New instances: no held-out task is a train task (some templates fix the instruction and
  # vary only the starting files).
  def whole(t):
    return t["instruction"], tuple(sorted(t["files"].items())), t["setup"], t["check"]
  assert {whole(t) for t in files_held}.isdisjoint(whole(t) for t in train)
  assert terminal.split(tasks, ("files",), ("git",)) == (tasks[:24], tasks[24:])   # 0: by family only
  with pytest.raises(ValueError, match="no 'files' task"):
    terminal.split(tasks[:1], ("files",), (), heldout_fraction=0.9)


def test_an_instance_split_alone_validates_and_plans():
  config = terminal_config.get_config("tiny")
  config.env.terminal.update(heldout_families=(), heldout_fraction=0.25)
  validate.validate(config)
  assert "the last 0.25 of each train family's tasks" in plan.make_plan(config).render()


@pytest.mark.parametrize("override,key", [
    (dict(train_families=("files", "git"), heldout_families=("git",)), "env.terminal.heldout_families"),
    (dict(heldout_families=()), "env.terminal.heldout_families"),
    (dict(heldout_fraction=1.0), "env.terminal.heldout_fraction"),
    (dict(tasks_per_family=2, heldout_fraction=0.1), "env.terminal.heldout_fraction"),
    (dict(train_families=("files", "nope")), "env.terminal.train_families"),
    (dict(tasks_per_family=0), "env.terminal.tasks_per_family"),
    (dict(extra=1), "env.terminal"),
])
def test_bad_terminal_sections_are_named(override, key):
  config = terminal_config.get_config("tiny")
  config.env.terminal.update(override)
  with pytest.raises(validate.ConfigError, match=key.replace(".", r"\.")):
    validate.validate(config)


def test_a_terminal_config_needs_an_agent_section():
  config = terminal_config.get_config("tiny")
  del config["agent"]
  with pytest.raises(validate.ConfigError, match="agent"):
    validate.validate(config)


def test_the_swe_agent_prompt_is_the_issue_without_code():
  env = SweAgentEnv(None, lambda s: len(s.split()), issue_token_budget=5)
  task = {"repo": "o/calc", "problem_statement": "add is wrong\n" + "very\n" * 50, "patch": ""}
  system, user = env.prompt_messages(task)
  assert "submit" in system["content"] and "/testbed" in user["content"]
  assert "add is wrong" in user["content"] and user["content"].count("very") < 10


def test_the_swe_oracle_edits_with_the_fewest_context_lines_that_are_unique():
  """Context grows until old_str occurs once in the file as the earlier edits left it; a new file is
  created; view covers the edited lines."""
  from dockyard.agent.envs import swe_oracle_calls
  from dockyard.sandbox import synthetic as rf
  old = "def f():\n  return 1\n\n\ndef g():\n  return 1\n\n\ndef h():\n  return 1\n"
  new = old.replace("def g():\n  return 1", "def g():\n  return 2")
  patch = rf.diff("m.py", old, new) + rf.diff("n.py", None, "X = 1\n")
  calls = swe_oracle_calls(patch, {"m.py": old}.get, context=0)
  assert [c.name for c in calls] == ["view", "edit", "create", "submit"]
  view, edit, create = (c.arguments for c in calls[:3])
  # context 0 ("  return 1") and its own line are not unique; one line each side is
  assert edit["old_str"] == "def g():\n  return 1\n\n" and edit["new_str"] == "def g():\n  return 2\n\n"
  assert old.replace(edit["old_str"], edit["new_str"]) == new
  assert view == {"path": "m.py", "start": 3, "end": 9}   # lines 5-7 +- 2
  assert create == {"path": "n.py", "content": "X = 1\n"}
  with pytest.raises(ValueError, match="exactly once"):
    swe_oracle_calls(rf.diff("m.py", "a\na\n", "a\nb\n"), {"m.py": "a\na\na\na\n"}.get)

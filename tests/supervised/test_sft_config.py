"""configs/sft.py: each misconfiguration is a ConfigError naming its key, before anything loads
(`dockyard.validate`, in process); the launch CLI's dry run plans the trainer and the generation
metric's engine; the chat JSONL reader names the line of a bad record."""
import json
import os
import subprocess
import sys

import pytest

from configs import sft as sft_config
from dockyard import config_lib, validate
from dockyard.supervised import data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config_with(**overrides):
  config = sft_config.get_config()
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


@pytest.mark.parametrize("key, value, words", [
    ("sft.num_steps", 0, "must be >= 1"),
    ("sft.batch_size", 0, "must be >= 1"),
    ("sft.val_period", -1, "must be >= 0"),
    ("sft.generate_period", -5, "must be >= 0"),
    ("optim.micro_batch_size", 0, "must be >= 1"),
    ("data.train", "/no/such/chats.jsonl", "no chat data file"),
    ("data.validation", "/tmp/heldout.jsonl", "set with data.train=''"),
    ("env.math.num_validation", 0, "the generation metric"),
    ("env.math.ops", ("^",), "ops must be a non-empty subset"),
    ("rollout.max_new_tokens", 128, "must be < rollout.max_model_len"),
    ("rollout.val_temperature", -1.0, "must be >= 0"),
    ("refit.canary.max_abs_logprob_delta", 0.0, "must be > 0"),
    ("policy.backend", "tf", "must be 'jax' or 'torch'"),
    ("checkpoint.save_period", 0, "must be >= 1"),
])
def test_bad_values_name_the_key(key, value, words):
  with pytest.raises(validate.ConfigError) as err:
    validate.validate(config_with(**{key: value}))
  assert err.value.key == ("env.math" if key == "env.math.ops" else key)   # env.math's own rules: the field leads the message
  assert str(err.value).startswith("config.") and words in str(err.value)


def test_engine_settings_are_not_checked_without_the_generation_metric():
  validate.validate(config_with(**{"sft.generate_period": 0, "rollout.max_new_tokens": 500}))


def test_unknown_override_names_the_key():
  with pytest.raises(validate.ConfigError, match=r"config.sft.num_step: unknown key.*did you mean 'sft.num_steps'"):
    validate.check_overrides(sft_config.get_config(), ["--config.sft.num_step=3"])
  with pytest.raises(validate.ConfigError, match="config.sft.batch_size: expected int"):
    validate.check_overrides(sft_config.get_config(), ["--config.sft.batch_size=many"])


def test_variants_validate_and_size_the_schedule():
  for arg in (None, "tiny", "torch"):
    config = sft_config.get_config(arg)
    validate.validate(config)
    assert config_lib.train_steps(config) == config.sft.num_steps
  assert sft_config.get_config("torch").policy.backend == "torch"
  with pytest.raises(ValueError, match="Unknown config argument 'mode'"):
    sft_config.get_config("mode=dpo")


def test_dry_run_plans_trainer_and_engine():
  result = subprocess.run([sys.executable, "-m", "dockyard.launch", "--config=configs/sft.py:torch",
                           "--config.run.dry_run=True", "--config.sft.batch_size=8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert "loop=sft" in out and "backend=torch" in out and "80 math chats" in out, out
  assert "rollout" in out and "in the trainer's process" in out and "sandbox" not in out, out
  assert "conversations_per_step=8" in out, out


def write(tmp_path, lines):
  path = tmp_path / "chats.jsonl"
  path.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
  return str(path)


def test_jsonl_reads_conversations(tmp_path):
  chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
          {"role": "assistant", "content": "Bye."}]
  convs = data.read_jsonl(write(tmp_path, [{"messages": chat}, "", {"messages": chat[1:3], "id": 7}]))
  assert [len(c.messages) for c in convs] == [5, 2]
  assert convs[1].messages[1] == {"role": "assistant", "content": "Hello."}


@pytest.mark.parametrize("record, words", [
    ("{not json", "not valid JSON"),
    ({"prompt": "Hi", "completion": "Hello"}, "expected a JSON object with 'messages'"),
    ({"messages": []}, "non-empty list"),
    ({"messages": [{"role": "user"}]}, "message 0 must be"),
    ({"messages": [{"role": "user", "content": "Hi"}]}, "no assistant message"),
    ({"messages": [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "?"}]},
     "starts with an assistant message"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]},
     "empty assistant turn"),
])
def test_jsonl_bad_record_names_its_line(tmp_path, record, words):
  good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
  path = write(tmp_path, [good, record])
  with pytest.raises(data.ChatDataError) as err:
    data.read_jsonl(path)
  assert str(err.value).startswith(f"{path}:2: ") and words in str(err.value)


def test_too_long_conversation_is_an_error(tiny_tokenizer):
  conv = data.Conversation(({"role": "user", "content": "Hi " * 200}, {"role": "assistant", "content": "Hello."}))
  with pytest.raises(ValueError, match="conversation 0: .* exceed policy.max_seq_len=128"):
    data.encode_conversations(tiny_tokenizer, [conv], 128)

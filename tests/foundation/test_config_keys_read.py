"""Every key of every shipped config is read by some product code (dockyard/, launch/): a key that
nothing reads is a knob that does nothing, and `validate` would accept overrides of it in silence.

The product source is parsed with `ast` (nothing runs). A leaf `section[.sub].key` counts as read
when the code has one of:
  - an attribute access `.parent.key` (`config.rollout.top_p`, `self.config.refit.canary.enabled`);
  - `alias.key` where `alias` was bound to the parent section: `r = config.rollout` (or
    `dict(config.rollout)`), or a parameter the section is passed to (`make_optimizer(m,
    config.optim)` binds `make_optimizer`'s second parameter);
  - a subscript or `.get` with the key as a string (`optim["b1"]`, `m.get("instruction", "")`),
    or a dotted path string ending in `parent.key`;
  - a field of that name on a dataclass built by `from_config` (`Limits.from_config(sandbox)`
    reads the fields it declares).
The planted-key test shows the check fails on a key nothing reads.
"""
import ast
import os

import pytest

from configs import dpo as dpo_config
from configs import eval as eval_config
from configs import math as math_config
from configs import online_dpo as online_dpo_config
from configs import distill as distill_config
from configs import rlaif as rlaif_config
from configs import rm as rm_config
from configs import sft as sft_config
from configs import swe as swe_config
from configs import swe_agent as swe_agent_config
from configs import terminal as terminal_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRODUCT = ("dockyard", "launch")
SHIPPED = [(swe_config, a) for a in ("tiny", "full", "torch", "sync", "full,torch", "moe")] + [
    (math_config, a) for a in ("tiny", "full", "smollm")] + [
    (m, a) for m in (swe_agent_config, terminal_config) for a in ("tiny", "full", "torch")] + [
    (dpo_config, a) for a in ("tiny", "torch", "mode=ipo", "mode=simpo", "mode=orpo,torch")] + [
    (sft_config, a) for a in ("tiny", "torch", "smollm")] + [
    (rm_config, a) for a in ("tiny", "torch")] + [
    (online_dpo_config, a) for a in ("tiny", "torch", "smollm", "mode=simpo")] + [
    (distill_config, a) for a in ("", "torch", "smollm")] + [
    (rlaif_config, a) for a in ("", "smollm", "torch,mode=ipo")] + [
    (eval_config, f"set={s}") for s in eval_config.SETS]


def leaves(node, prefix=()):
  for key, value in node.items():
    if hasattr(value, "items"):
      yield from leaves(value, prefix + (key,))
    else:
      yield prefix + (key,)


def _chain(node) -> list[str]:
  """`a.b.c` -> ['a', 'b', 'c']; a chain rooted in a call or subscript keeps its attribute tail."""
  out = []
  while isinstance(node, ast.Attribute):
    out.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name):
    out.append(node.id)
  return out[::-1]


def _unwrap_dict(node):
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and node.args:
    return node.args[0]
  return node


class Reads:
  """What the product source reads, in the forms the module docstring lists."""

  def __init__(self, dirs):
    trees = []
    for d in dirs:
      for dirpath, _, files in os.walk(d):
        trees += [ast.parse(open(os.path.join(dirpath, f)).read()) for f in files if f.endswith(".py")]
    params: dict[str, list[list[str]]] = {}
    self.from_config_fields: set[str] = set()
    for tree in trees:
      for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
          ps = [a.arg for a in n.args.posonlyargs + n.args.args]
          params.setdefault(n.name, []).append(ps[1:] if ps[:1] in (["self"], ["cls"]) else ps)
        if isinstance(n, ast.ClassDef) and any(
            isinstance(b, ast.FunctionDef) and b.name == "from_config" for b in n.body):
          self.from_config_fields |= {b.target.id for b in n.body
                                      if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)}
    self.pairs: set[tuple[str, str]] = set()
    self.strings: set[str] = set()
    self.aliases: dict[str, set[str]] = {}
    for tree in trees:
      for n in ast.walk(tree):
        if isinstance(n, ast.Attribute):
          c = _chain(n)
          self.pairs |= set(zip(c, c[1:]))
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
          self.strings.add(n.slice.value)
        elif isinstance(n, ast.Call):
          fn = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
          for a in n.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str):
              if fn in ("get", "_get") or "." in a.value:
                self.strings.add(a.value)
          for i, a in enumerate(n.args):   # a section passed positionally binds the parameter
            a = _unwrap_dict(a)
            if isinstance(a, ast.Attribute):
              for ps in params.get(fn, []):
                if i < len(ps):
                  self.aliases.setdefault(ps[i], set()).add(a.attr)
          for kw in n.keywords:
            a = _unwrap_dict(kw.value)
            if kw.arg and isinstance(a, ast.Attribute):
              self.aliases.setdefault(kw.arg, set()).add(a.attr)
        elif isinstance(n, ast.Assign):
          target, value = n.targets[0], n.value
          pairs = (list(zip(target.elts, value.elts))
                   if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) else [(target, value)])
          for t, v in pairs:
            v = _unwrap_dict(v)
            if isinstance(v, ast.Attribute) and isinstance(t, (ast.Name, ast.Attribute)):
              name = t.id if isinstance(t, ast.Name) else t.attr
              self.aliases.setdefault(name, set()).add(v.attr)

  def how(self, path: tuple[str, ...]) -> str | None:
    key = path[-1]
    parent = path[-2] if len(path) > 1 else None
    if (parent, key) in self.pairs:
      return "attribute"
    if any(parent in sections and (alias, key) in self.pairs for alias, sections in self.aliases.items()):
      return "alias"
    if key in self.strings or any(s.endswith(f"{parent}.{key}") for s in self.strings):
      return "string"
    if key in self.from_config_fields:
      return "from_config field"
    return None


@pytest.fixture(scope="module")
def reads():
  return Reads([os.path.join(ROOT, d) for d in PRODUCT])


@pytest.mark.parametrize("module, arg", SHIPPED, ids=[f"{m.__name__.split('.')[-1]}:{a}" for m, a in SHIPPED])
def test_every_config_key_is_read(reads, module, arg):
  config = module.get_config(arg)
  unread = [".".join(p) for p in leaves(config) if reads.how(p) is None]
  assert not unread, (f"{module.__name__}:{arg}: keys no product code reads (make them work or "
                      f"remove them): {unread}")


def test_a_planted_unread_key_is_caught(reads):
  config = swe_config.get_config("tiny")
  config.run.planted_knob = 1
  config.refit.canary.planted_probe_count = 4
  config.sandbox.planted_nothing = ""
  unread = {".".join(p) for p in leaves(config) if reads.how(p) is None}
  assert unread == {"run.planted_knob", "refit.canary.planted_probe_count", "sandbox.planted_nothing"}
  # and each form of reading is seen
  assert reads.how(("run", "dry_run")) == "attribute"                     # config.run.dry_run
  assert reads.how(("optim", "b1")) == "string"                            # optim["b1"]
  assert reads.how(("sandbox", "memory_mb")) == "from_config field"        # Limits.from_config
  assert reads.how(("eval", "num_samples")) in ("alias", "attribute")      # e = config.eval; e.num_samples


def test_the_removed_inert_keys_stay_removed():
  for module, arg in SHIPPED:
    config = module.get_config(arg)
    paths = {".".join(p) for p in leaves(config)}
    assert not paths & {"data.prompt_batching", "logging.log_period", "sandbox.launch_local_fleet",
                        "grpo.async_grpo.recompute_kv_cache_after_weight_updates"}
    if module is not rm_config:   # the reward model pads its batches itself (rm/loop.py)
      assert "policy.seq_bucket" in paths   # read by the JAX trainer, so declared (and validated)


def test_each_sweep_brackets_the_rate_its_config_trains_at():
  from dockyard import sweep as h
  for module, arg in SHIPPED:
    if module is eval_config:   # evaluation trains nothing: no sweep
      continue
    lr = module.get_config(arg).optim.lr
    rates = {t["config.optim.lr"] for t in module.get_hyper(h, arg)}
    assert min(rates) < lr < max(rates), f"{module.__name__}:{arg} trains at {lr}, sweeps {sorted(rates)}"

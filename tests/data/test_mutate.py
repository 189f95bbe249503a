"""The AST mutator: each kind of mutation, minimal text edits, valid code, determinism."""
import ast

import pytest

from dockyard.data import mutate

SOURCE = '''\
import math


def clamp(x, lo=0, hi=10, strict=False):
    """Docstring 1 stays."""
    # a comment that must survive
    if strict and x is None:
        raise ValueError("x")
    if x < lo:
        return lo
    total = x + 1
    total -= 2
    if not (x > hi):
        return max(x, lo)
    return hi


class Box:
    def area(self, w, h):
        return w * h
'''


def _by_kind(ms):
  out = {}
  for m in ms:
    out.setdefault(m.kind, []).append(m)
  return out


def _changed_lines(src, m):
  a, b = src.splitlines(), m.apply(src).splitlines()
  return [(x, y) for x, y in zip(a, b) if x != y], len(a) - len(b)


def test_every_kind_is_found_and_edits_only_its_line():
  ms = mutate.mutations("m.py", SOURCE)
  kinds = _by_kind(ms)
  for kind in ("binop", "augassign", "compare", "boolop", "off_by_one", "drop_branch", "swap_args",
               "wrong_default", "drop_not"):
    assert kind in kinds, f"no {kind} mutation found"
  for m in ms:
    new = m.apply(SOURCE)
    ast.parse(new)
    assert "# a comment that must survive" in new and '"""Docstring 1 stays."""' in new
    changed, removed = _changed_lines(SOURCE, m)
    if m.kind == "drop_branch":
      assert removed >= 2
    else:
      assert removed == 0 and len(changed) == 1, (m, changed)


@pytest.mark.parametrize("kind,before,after", [
    ("compare", "    if x < lo:", "    if x <= lo:"),
    ("augassign", "    total -= 2", "    total += 2"),
    ("boolop", "    if strict and x is None:", "    if strict or x is None:"),
    ("swap_args", "        return max(x, lo)", "        return max(lo, x)"),
    ("binop", "        return w * h", "        return w // h"),
    ("drop_not", "    if not (x > hi):", "    if (x > hi):"),
])
def test_specific_edits(kind, before, after):
  ms = [m for m in mutate.mutations("m.py", SOURCE) if m.kind == kind]
  results = {m.apply(SOURCE) for m in ms}
  assert any(before in SOURCE and after in r.splitlines() for r in results), (kind, sorted(results)[:3])


def test_is_becomes_is_not_and_wrong_default():
  ms = mutate.mutations("m.py", SOURCE)
  texts = [m.apply(SOURCE) for m in ms]
  assert any("x is not None" in t for t in texts)
  assert any("def clamp(x, lo=0, hi=10, strict=True):" in t for t in texts)
  assert any("def clamp(x, lo=1, hi=10, strict=False):" in t for t in texts)


def test_docstrings_and_strings_untouched():
  ms = mutate.mutations("m.py", SOURCE)
  assert all("Docstring" not in e.text for m in ms for e in m.edits)
  # 'x' + ... string concatenation is never flipped to a subtraction.
  ms = mutate.mutations("s.py", "def f(a):\n    return 'x' + a\n")
  assert not [m for m in ms if m.kind == "binop"]


def test_deterministic_and_keys_unique():
  a = mutate.mutations("m.py", SOURCE)
  b = mutate.mutations("m.py", SOURCE)
  assert [m.key for m in a] == [m.key for m in b]
  assert len({m.key for m in a}) == len(a)
  assert {m.function for m in a} == {"clamp", "Box.area"}


def test_multibyte_source_offsets():
  src = 'def f(a):\n    s = "héllo"  # ünïcode\n    return a < 3\n'
  ms = [m for m in mutate.mutations("u.py", src) if m.kind == "compare"]
  assert [m.apply(src).splitlines()[2] for m in ms] == ["    return a <= 3"]

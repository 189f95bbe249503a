"""Procedural bug injection, SWE-smith style: small AST-located mutations of one function.

Each `Mutation` is a list of byte-range edits to one source file, found through the AST but applied
to the original text, so the gold fix (the reverse diff) touches only the mutated line(s) and keeps
the file's comments and formatting. Kinds: operator flips (arithmetic, comparison, boolean,
augmented assignment), off-by-one on integer literals, dropped `if` branch, swapped call arguments,
wrong default value, dropped `not`, flipped boolean literal. Every mutant is re-parsed; one that is
not valid Python, or that leaves the function's AST unchanged, is never produced.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import re
from typing import Iterator

BINOP_FLIPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"),
               ast.FloorDiv: ("//", "*"), ast.Div: ("/", "*"), ast.Mod: ("%", "//"),
               ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&"), ast.LShift: ("<<", ">>"),
               ast.RShift: (">>", "<<")}
CMP_FLIPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
             ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is not", "is"),
             ast.IsNot: ("is not", "is"), ast.In: ("not in", "in"), ast.NotIn: ("not in", "in")}


@dataclasses.dataclass(frozen=True)
class Edit:
  start: int          # byte offset into the UTF-8 source
  end: int
  text: str


@dataclasses.dataclass(frozen=True)
class Mutation:
  path: str           # file, relative to the repository root
  function: str       # qualified name of the mutated function (Class.method)
  kind: str           # binop | compare | boolop | augassign | off_by_one | drop_branch | ...
  lineno: int         # first line touched (1-based, in the original)
  edits: tuple[Edit, ...]
  func_lines: int     # length of the function in lines (short ones make easy tasks)

  @property
  def key(self) -> str:
    """A stable short id for this mutation (used in instance ids)."""
    blob = f"{self.path}|{self.function}|{self.kind}|" + "|".join(
        f"{e.start}:{e.end}:{e.text}" for e in self.edits)
    return hashlib.sha1(blob.encode()).hexdigest()[:8]

  def apply(self, source: str) -> str:
    data = source.encode("utf-8")
    for e in sorted(self.edits, key=lambda e: e.start, reverse=True):
      data = data[:e.start] + e.text.encode("utf-8") + data[e.end:]
    return data.decode("utf-8")


class _Offsets:
  """(lineno, col) in UTF-8 bytes, as the AST reports them, to absolute byte offsets."""

  def __init__(self, data: bytes):
    self.starts = [0]
    for i, b in enumerate(data):
      if b == 0x0A:
        self.starts.append(i + 1)

  def __call__(self, lineno: int, col: int) -> int:
    return self.starts[lineno - 1] + col


def _token_between(data: bytes, lo: int, hi: int, token: str) -> tuple[int, int] | None:
  """Byte span of `token` in data[lo:hi] (the text between two operands), if present exactly once."""
  seg = data[lo:hi].decode("utf-8")
  if "#" in seg or "\\" in seg:
    return None
  # Word operators need word boundaries; symbols must not be part of a longer symbol.
  if token[0].isalpha():
    pat = r"(?<![\w])" + r"\s+".join(map(re.escape, token.split())) + r"(?![\w])"
  else:
    pat = r"(?<![-+*/%<>=!&|^~])" + re.escape(token) + r"(?![-+*/%<>=!&|^~])"
  found = list(re.finditer(pat, seg))
  if len(found) != 1:
    return None
  m = found[0]
  return lo + len(seg[:m.start()].encode()), lo + len(seg[:m.end()].encode())


def _functions(tree: ast.AST) -> Iterator[tuple[str, ast.AST]]:
  def walk(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = prefix + child.name
        yield name, child
        yield from walk(child, name + ".")
      elif isinstance(child, ast.ClassDef):
        yield from walk(child, prefix + child.name + ".")
  yield from walk(tree, "")


def _own_nodes(func: ast.AST) -> Iterator[ast.AST]:
  """Nodes of the function body, not descending into nested functions or classes."""
  stack = list(func.body)
  while stack:
    node = stack.pop()
    yield node
    for child in ast.iter_child_nodes(node):
      # f-string parts have unreliable positions; nested scopes are other functions.
      if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
                                ast.JoinedStr)):
        stack.append(child)


def _is_docstring(node: ast.AST, func: ast.AST) -> bool:
  return bool(func.body) and isinstance(func.body[0], ast.Expr) and func.body[0].value is node


def _stringy(node: ast.BinOp) -> bool:
  """`'a' + x` or `'%s' % x`: flipping these only raises TypeError, an implausible bug."""
  return any(isinstance(x, ast.JoinedStr) or (isinstance(x, ast.Constant) and isinstance(x.value, (str, bytes)))
             for x in (node.left, node.right))


def _sites(data: bytes, off: _Offsets, func: ast.AST) -> Iterator[tuple[str, int, list[Edit]]]:
  pos = lambda n: off(n.lineno, n.col_offset)
  end = lambda n: off(n.end_lineno, n.end_col_offset)
  seg = lambda n: data[pos(n):end(n)].decode("utf-8")
  # Wrong default values.
  defaults = list(func.args.defaults) + [d for d in func.args.kw_defaults if d is not None]
  for d in defaults:
    if isinstance(d, ast.Constant) and isinstance(d.value, bool):
      yield "wrong_default", d.lineno, [Edit(pos(d), end(d), str(not d.value))]
    elif isinstance(d, ast.Constant) and type(d.value) is int and seg(d).isdigit():
      yield "wrong_default", d.lineno, [Edit(pos(d), end(d), str(d.value + 1))]
  for node in _own_nodes(func):
    if isinstance(node, ast.BinOp) and type(node.op) in BINOP_FLIPS and not _stringy(node):
      old, new = BINOP_FLIPS[type(node.op)]
      span = _token_between(data, end(node.left), pos(node.right), old)
      if span:
        yield "binop", node.lineno, [Edit(*span, new)]
    elif isinstance(node, ast.AugAssign) and type(node.op) in BINOP_FLIPS:
      old, new = BINOP_FLIPS[type(node.op)]
      span = _token_between(data, end(node.target), pos(node.value), old + "=")
      if span:
        yield "augassign", node.lineno, [Edit(*span, new + "=")]
    elif isinstance(node, ast.Compare):
      left = node.left
      for op, right in zip(node.ops, node.comparators):
        old, new = CMP_FLIPS[type(op)]
        if isinstance(op, (ast.Is, ast.In)):
          old, new = new, old   # the table lists (negated, plain); the source has the plain one
        span = _token_between(data, end(left), pos(right), old)
        if span:
          yield "compare", node.lineno, [Edit(*span, new)]
        left = right
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
      old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
      span = _token_between(data, end(node.values[0]), pos(node.values[1]), old)
      if span:
        yield "boolop", node.lineno, [Edit(*span, new)]
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
      span = _token_between(data, pos(node), pos(node.operand), "not")
      gap = data[span[1]:pos(node.operand)] if span else b"?"
      if gap.strip() == b"":
        yield "drop_not", node.lineno, [Edit(span[0], pos(node.operand), "")]
      elif gap.strip() == b"(":
        yield "drop_not", node.lineno, [Edit(span[0], span[1] + gap.index(b"("), "")]
    elif isinstance(node, ast.Constant) and not _is_docstring(node, func):
      if isinstance(node.value, bool):
        yield "flip_bool", node.lineno, [Edit(pos(node), end(node), str(not node.value))]
      elif type(node.value) is int and seg(node).isdigit() and node.value <= 64:
        yield "off_by_one", node.lineno, [Edit(pos(node), end(node), str(node.value + 1))]
        if node.value > 0:
          yield "off_by_one", node.lineno, [Edit(pos(node), end(node), str(node.value - 1))]
    elif isinstance(node, ast.Call) and len(node.args) >= 2:
      a, b = node.args[0], node.args[1]
      one_line = a.lineno == a.end_lineno == b.lineno == b.end_lineno   # a readable one-line fix
      if one_line and not any(isinstance(x, ast.Starred) for x in (a, b)) and seg(a) != seg(b):
        yield "swap_args", node.lineno, [Edit(pos(a), end(a), seg(b)), Edit(pos(b), end(b), seg(a))]
  # Dropped branches: an `if` without `else` that is not the only statement of its block.
  for node in [func, *_own_nodes(func)]:
    for field in ("body", "orelse", "finalbody"):
      block = getattr(node, field, None)
      if not isinstance(block, list) or len(block) < 2:
        continue
      for stmt in block:
        if isinstance(stmt, ast.If) and not stmt.orelse:
          start = off.starts[stmt.lineno - 1]
          if data[start:pos(stmt)].strip() or not data[pos(stmt):].startswith(b"if"):
            continue
          stop = off.starts[stmt.end_lineno] if stmt.end_lineno < len(off.starts) else len(data)
          if data[end(stmt):stop].strip():
            continue
          yield "drop_branch", stmt.lineno, [Edit(start, stop, "")]


def _segment(data: bytes, off: _Offsets, func: ast.AST) -> tuple[int, int]:
  """Byte span of a function from its `def` to the end of its last line (newline included)."""
  start = off(func.lineno, func.col_offset)
  stop = off.starts[func.end_lineno] if func.end_lineno < len(off.starts) else len(data)
  return start, stop


def mutations(path: str, source: str) -> list[Mutation]:
  """All single mutations of the functions in `source` that parse and change the function's AST.

  Each mutant is checked by parsing the mutated function on its own (its `def` ... last line):
  every edit lies inside that span, and parsing one function instead of the whole module for each
  of ~1000 mutants of a large file is what keeps this fast.
  """
  data = source.encode("utf-8")
  tree = ast.parse(source)
  off = _Offsets(data)
  out = []
  for name, func in _functions(tree):
    func_lines = func.end_lineno - func.lineno + 1
    lo, hi = _segment(data, off, func)
    try:
      before = ast.dump(ast.parse(data[lo:hi]).body[0])
    except SyntaxError:   # text after the function on its last line; leave such a function alone
      continue
    for kind, lineno, edits in _sites(data, off, func):
      if any(e.start < lo or e.end > hi for e in edits):
        continue
      m = Mutation(path, name, kind, lineno, tuple(edits), func_lines)
      seg = data[lo:hi]
      for e in sorted(edits, key=lambda e: e.start, reverse=True):
        seg = seg[:e.start - lo] + e.text.encode("utf-8") + seg[e.end - lo:]
      try:
        after = ast.parse(seg).body
      except SyntaxError:
        continue
      if len(after) == 1 and ast.dump(after[0]) != before:
        out.append(m)
  out.sort(key=lambda m: (m.function, m.lineno, m.kind, m.key))
  return out

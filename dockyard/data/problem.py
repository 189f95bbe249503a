"""Problem statements written from a failing test (its name, docstring and failing assertion), no model.

The text reads like a short bug report: which test fails, what it checks (its docstring), the
assertion line in the test and the error it raises. It never names the mutated function or the
kind of mutation; it only says what a user running the test would see.
"""
from __future__ import annotations

import ast
import os
import re
from typing import Mapping, Sequence

MAX_MESSAGE = 600


def _find_test(tree: ast.AST, parts: Sequence[str]) -> ast.AST | None:
  node = tree
  for part in parts:
    found = None
    for child in getattr(node, "body", []):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
        found = child
        break
    if found is None:
      return None
    node = found
  return node


def clean_message(message: str, roots: Sequence[str] = ()) -> str:
  """Strips run-specific noise (temp paths, object addresses) so the text is reproducible."""
  for root in roots:
    if root:
      message = message.replace(root.rstrip("/") + "/", "").replace(root, ".")
  message = re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", message)
  message = message.strip()
  if len(message) > MAX_MESSAGE:
    message = message[:MAX_MESSAGE] + " [...]"
  return message


def humanize(name: str) -> str:
  name = re.sub(r"^test_?", "", name)
  name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
  return name.replace("_", " ").strip().lower() or name


def write(tree_dir: str, failing: Sequence[str], failures: Mapping[str, Mapping],
          roots: Sequence[str] = ()) -> str:
  """The problem statement for a task whose FAIL_TO_PASS tests are `failing` (sorted)."""
  # Lead with an assertion failure when there is one: it says what was expected.
  lead = sorted(failing, key=lambda t: ("AssertionError" not in failures.get(t, {}).get("message", ""), t))[0]
  file, _, rest = lead.partition("::")
  parts = [p for p in re.sub(r"\[.*\]$", "", rest).split("::") if p]
  name = parts[-1] if parts else lead
  doc, line_src, lineno = "", "", None
  path = os.path.join(tree_dir, file)
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      source = f.read()
    node = _find_test(ast.parse(source), parts)
    if node is not None:
      doc = (ast.get_docstring(node) or "").strip()
    lines = source.splitlines()
    info = failures.get(lead, {})
    for loc_path, loc_line in reversed(info.get("locations", [])):
      if loc_path and os.path.normpath(loc_path).endswith(os.path.normpath(file)) and loc_line:
        lineno = int(loc_line)
        line_src = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
        break
  message = clean_message(failures.get(lead, {}).get("message", ""), roots)
  out = [f"`{name}` fails: {humanize(name)} is broken", ""]
  out.append(f"Running `python -m pytest {lead}` fails.")
  if doc:
    out += ["", "What the test checks:", "", *("> " + l for l in doc.splitlines())]
  if line_src:
    out += ["", f"The failing check ({file}, line {lineno}):", "", "```python", line_src, "```"]
  if message:
    out += ["", "The error:", "", "```", message, "```"]
  others = [t for t in failing if t != lead]
  if others:
    out += ["", f"{len(others)} other test{'s' if len(others) > 1 else ''} fail{'' if len(others) > 1 else 's'} "
            "the same way" + (":" if len(others) <= 5 else f", among them:")]
    out += [f"- `{t}`" for t in others[:5]]
  out += ["", "The tests are right; the library code needs fixing."]
  return "\n".join(out) + "\n"

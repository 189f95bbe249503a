"""No import cycles among dockyard's modules, counting deferred imports (inside functions) too: a
cycle broken only by importing late is still two modules that cannot be understood apart.

Every module under dockyard/ is parsed with `ast` (nothing is imported); each `import x` /
`from x import y` / relative import that names a dockyard module is an edge. `from pkg import name`
is an edge to `pkg.name` when that is a module, else to `pkg`. Checked twice: between modules, and
between dockyard's top-level parts (each subpackage, e.g. `dockyard.refit`, is one node; each
top-level module is its own), where `refit -> rollout -> refit` is a cycle even when no single
module closes it."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))



def module_files(package_dir):
  """{module name: path} for every .py file under package_dir."""
  out = {}
  base = os.path.dirname(package_dir)
  for dirpath, _, files in os.walk(package_dir):
    for f in files:
      if not f.endswith(".py"):
        continue
      rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].split(os.sep)
      if rel[-1] == "__init__":
        rel = rel[:-1]
      out[".".join(rel)] = os.path.join(dirpath, f)
  return out


def import_graph(package_dir):
  """{module: set of dockyard modules it imports anywhere in its body}."""
  modules = module_files(package_dir)
  root = os.path.basename(package_dir)
  graph = {}
  for name, path in modules.items():
    is_pkg = path.endswith("__init__.py")
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    edges = set()

    def add(target):
      # the deepest module that exists along the dotted name (`a.b.func` -> `a.b`)
      parts = target.split(".")
      while parts and ".".join(parts) not in modules:
        parts.pop()
      if parts and ".".join(parts) != name:
        edges.add(".".join(parts))

    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for a in node.names:
          if a.name.split(".")[0] == root:
            add(a.name)
      elif isinstance(node, ast.ImportFrom):
        if node.level:
          here = name.split(".") if is_pkg else name.split(".")[:-1]
          here = here[:len(here) - (node.level - 1)]
          mod = ".".join(here + ([node.module] if node.module else []))
        else:
          mod = node.module or ""
        if mod.split(".")[0] != root:
          continue
        for a in node.names:
          full = f"{mod}.{a.name}"
          add(full if full in modules else mod)
    graph[name] = edges
  return graph


def part(module):
  """`dockyard.refit.nccl` -> `dockyard.refit`; `dockyard.runner` stays itself."""
  return ".".join(module.split(".")[:2])


def part_graph(graph):
  out = {}
  for m, es in graph.items():
    out.setdefault(part(m), set()).update(part(e) for e in es if part(e) != part(m))
  return out


def cycles(graph):
  """Strongly connected components with more than one module (Tarjan), each sorted."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def a_path(graph, comp):
  """One concrete loop through a component, for the message: a -> b -> ... -> a."""
  members = set(comp)
  start = comp[0]
  prev, frontier = {start: None}, [start]
  while frontier:
    nxt = []
    for v in frontier:
      for w in sorted(graph[v] & members):
        if w == start:
          path = [v]
          while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
          return " -> ".join(reversed(path)) + f" -> {start}"
        if w not in prev:
          prev[w] = v
          nxt.append(w)
    frontier = nxt
  return " <-> ".join(comp)


def test_dockyard_modules_have_no_import_cycles():
  graph = import_graph(os.path.join(ROOT, "dockyard"))
  assert len(graph) > 50, "the walk found too few modules: is ROOT right?"
  found = cycles(graph)
  assert not found, "import cycles between modules (deferred imports count):\n" + "\n".join(
      a_path(graph, c) for c in found)


def test_dockyard_parts_have_no_import_cycles():
  modules = import_graph(os.path.join(ROOT, "dockyard"))
  graph = part_graph(modules)
  assert {"dockyard.refit", "dockyard.rollout", "dockyard.models"} <= set(graph)
  found = cycles(graph)

  def witness(comp):   # the module edges that close the loop between parts
    loop = a_path(graph, comp)
    hops = loop.split(" -> ")
    lines = [loop]
    for a, b in zip(hops, hops[1:]):
      lines += [f"    {m} -> {e}" for m, es in sorted(modules.items()) for e in sorted(es)
                if part(m) == a and part(e) == b]
    return "\n".join(lines)
  assert not found, "import cycles between dockyard's parts:\n" + "\n".join(witness(c) for c in found)


def test_the_detector_sees_deferred_and_relative_cycles(tmp_path):
  # a planted package: a imports b at top level, b imports a inside a function (relatively),
  # c imports d's package-level name; only {a, b} is a cycle
  pkg = tmp_path / "dockyard"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from dockyard.sub import b\n")
  (pkg / "sub" / "b.py").write_text("def f():\n  from .. import a\n  return a\n")
  (pkg / "c.py").write_text("import dockyard.sub.d\n")
  (pkg / "sub" / "d.py").write_text("import os\n")
  graph = import_graph(str(pkg))
  assert graph["dockyard.a"] == {"dockyard.sub.b"}
  assert graph["dockyard.sub.b"] == {"dockyard.a"}
  assert cycles(graph) == [["dockyard.a", "dockyard.sub.b"]]
  assert a_path(graph, ["dockyard.a", "dockyard.sub.b"]) == (
      "dockyard.a -> dockyard.sub.b -> dockyard.a")
  # between parts: sub.d -> c closes sub -> c -> sub though no module pair is a cycle
  (pkg / "sub" / "d.py").write_text("def g():\n  import dockyard.e\n")
  (pkg / "e.py").write_text("")
  (pkg / "sub" / "f.py").write_text("from dockyard import c\n")
  graph = import_graph(str(pkg))
  graph["dockyard.a"] = set()                # drop the module cycle
  assert cycles(graph) == []
  assert cycles(part_graph(graph)) == [["dockyard.c", "dockyard.sub"]]


if __name__ == "__main__":
  pytest.main([__file__])

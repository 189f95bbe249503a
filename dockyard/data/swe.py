"""SWE task records in the SWE-bench instance schema: the dataclass, loaders and a writer.

Reads our own `data/swe/*.jsonl` and real SWE-bench / SWE-Gym / SWE-smith files a user has on disk:
JSONL, a JSON list, or parquet (needs pyarrow, not in the pinned stack). There, FAIL_TO_PASS and
PASS_TO_PASS are often JSON-encoded strings; they are decoded here. Keys beyond the schema are kept
in `extra`; dockyard's own builder metadata lives in `meta`. `environment` (optional) is the
record the sandbox builds the tests' venv from (`dockyard.sandbox.environments`; checked on load,
attached from a registry by `python -m dockyard.data.import_swe`). `SweTask.sandbox_dict(patch)` is
what the sandbox gets: the schema keys only, with `patch` replaced by the patch under test.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Iterator, Mapping

REQUIRED = ("instance_id", "repo", "base_commit", "patch", "FAIL_TO_PASS", "PASS_TO_PASS")
SANDBOX_KEYS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS",
                "PASS_TO_PASS", "version")


@dataclasses.dataclass
class SweTask:
  instance_id: str
  repo: str                      # "owner/name"
  base_commit: str               # the tree the agent starts from (for our tasks: the buggy tree)
  patch: str                     # the gold fix, a unified diff
  FAIL_TO_PASS: list[str]        # pytest node ids that the fix must make pass
  PASS_TO_PASS: list[str]        # node ids that must keep passing
  test_patch: str = ""           # held-out tests applied before the run ("" : none)
  problem_statement: str = ""
  version: str = ""
  created_at: str = ""
  hints_text: str = ""
  environment_setup_commit: str = ""
  environment: dict[str, Any] | None = None    # the tests' venv spec; None: the executor's Python
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)    # dockyard builder metadata
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)   # other keys of foreign files

  @classmethod
  def from_dict(cls, rec: Mapping[str, Any], where: str = "") -> "SweTask":
    where = where or "task record"
    if not isinstance(rec, Mapping):
      raise ValueError(f"{where}: expected an object, got {type(rec).__name__}")
    name = rec.get("instance_id", "?")
    missing = [k for k in REQUIRED if k not in rec or rec[k] is None]
    if missing:
      raise ValueError(f"{where} ({name}): missing required key(s) {missing}")
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in rec.items() if k in fields and k not in ("meta", "extra")}
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
      kw[key] = _test_list(rec[key], f"{where} ({name}) {key}")
    for key in ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
                "version", "created_at", "hints_text", "environment_setup_commit"):
      if key in kw:
        if kw[key] is None:
          kw[key] = ""
        if key == "version" and isinstance(kw[key], (int, float)):
          kw[key] = str(kw[key])   # SWE-bench versions like 3.0 are sometimes numbers
        if not isinstance(kw[key], str):
          raise ValueError(f"{where} ({name}): {key} must be a string, got {type(kw[key]).__name__}")
    if kw.get("environment") is not None:
      from dockyard.sandbox.environments import EnvironmentSpecError, parse_spec
      try:
        parse_spec(kw["environment"])
      except EnvironmentSpecError as e:
        raise ValueError(f"{where} ({name}): {e}") from None
      kw["environment"] = dict(kw["environment"])
    if kw["repo"].count("/") != 1:
      raise ValueError(f"{where} ({name}): repo must be 'owner/name', got {kw['repo']!r}")
    meta = rec.get("meta") or {}
    extra = {k: v for k, v in rec.items() if k not in fields}
    return cls(**kw, meta=dict(meta), extra=extra)

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    extra = d.pop("extra")
    if not d["meta"]:
      d.pop("meta")
    if d["environment"] is None:
      d.pop("environment")
    d.update(extra)
    return d

  def sandbox_dict(self, patch: str | None = None) -> dict[str, Any]:
    """The wire-format task: schema keys only, `patch` replaced by the patch under test."""
    d = {k: getattr(self, k) for k in SANDBOX_KEYS}
    if self.environment is not None:
      d["environment"] = self.environment
    if patch is not None:
      d["patch"] = patch
    return d


def _test_list(value: Any, where: str) -> list[str]:
  if isinstance(value, str):
    try:
      value = json.loads(value) if value.strip() else []
    except json.JSONDecodeError as e:
      raise ValueError(f"{where}: a string that is not a JSON list of test ids ({e})") from None
  if hasattr(value, "tolist"):    # a numpy array from parquet
    value = value.tolist()
  if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
    raise ValueError(f"{where}: expected a list of test ids (strings), got {value!r:.200}")
  return list(value)


def _records(path: str) -> Iterator[tuple[str, Any]]:
  if path.endswith(".parquet"):
    try:
      import pyarrow.parquet as pq
    except ImportError:
      raise ImportError(f"reading {path} needs pyarrow, which is not installed in this environment; "
                        "install it, or convert the file to JSONL") from None
    for i, rec in enumerate(pq.read_table(path).to_pylist()):
      yield f"{path}[{i}]", rec
  elif path.endswith(".json"):
    with open(path) as f:
      data = json.load(f)
    if not isinstance(data, list):
      raise ValueError(f"{path}: a .json task file must hold a list of task objects")
    for i, rec in enumerate(data):
      yield f"{path}[{i}]", rec
  elif path.endswith((".jsonl", ".ndjson")):
    with open(path) as f:
      for lineno, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          rec = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
        yield f"{path}:{lineno}", rec
  else:
    raise ValueError(f"{path}: unknown task file type; expected .jsonl, .json or .parquet")


def load_tasks(path: str, limit: int | None = None) -> list[SweTask]:
  """Loads task records; every record is checked, errors name the file and line."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"task file {path!r} does not exist")
  tasks, seen = [], set()
  for where, rec in _records(path):
    task = SweTask.from_dict(rec, where)
    if task.instance_id in seen:
      raise ValueError(f"{where}: duplicate instance_id {task.instance_id!r}")
    seen.add(task.instance_id)
    tasks.append(task)
    if limit is not None and len(tasks) >= limit:
      break
  return tasks


def write_jsonl(path: str, tasks: Iterable[SweTask | Mapping[str, Any]]) -> int:
  """Writes tasks one JSON object a line, keys sorted (byte-stable for the same records)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  n = 0
  with open(path, "w") as f:
    for t in tasks:
      d = t.to_dict() if isinstance(t, SweTask) else dict(t)
      f.write(json.dumps(d, sort_keys=True, ensure_ascii=False) + "\n")
      n += 1
  return n

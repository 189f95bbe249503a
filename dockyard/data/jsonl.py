"""Reading a JSONL data file record by record, each bad line named as `path:line`."""
from __future__ import annotations

import json
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def read_records(path: str, parse: Callable[[Any, str], T], error: type[Exception], what: str) -> list[T]:
  """`parse(record, "path:line")` for each non-blank line of `path`; raises `error` naming the first
  line that is not JSON, or the file when it holds no `what`."""
  out = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{number}"
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
      out.append(parse(record, where))
  if not out:
    raise error(f"{path}: no {what} in the file")
  return out

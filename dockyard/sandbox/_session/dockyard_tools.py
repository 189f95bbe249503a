"""File tools for an agent session, run INSIDE the session's sandbox (bwrap, uid 65534).

Reads one JSON request {"tool": name, "args": {...}} on stdin, writes one JSON answer on stdout:
{"ok": true, "output": text, ...} or {"ok": false, "error": message}. Tools: view (a line range
of a file, or a directory listing), edit (replace a string that occurs exactly once), create (a
new file; overwrite=true to replace one), search (a grep-like scan, literal or regex).

Paths are relative to /testbed (an absolute path must lie under it); one that leaves the checkout
(`..`, an absolute path elsewhere, a symlink resolving outside) or names .git is refused. This
check is for clear errors; containment does not rest on it: the script runs as the sandbox user
in the session's sandbox, which sees nothing but the session's own checkout to write.
Standard library only; the interpreter starts with -P -s -B, so no checkout file shadows a module.
"""
import json
import os
import re
import sys

ROOT = "/testbed"
MAX_VIEW_LINES = 2000
MAX_OUTPUT_CHARS = 256 << 10
MAX_LINE_CHARS = 400
MAX_SEARCH_FILE_BYTES = 2 << 20
MAX_WALK_ENTRIES = 100_000


class ToolError(Exception):
  pass


def _resolve(path, kind="path"):
  if not isinstance(path, str) or not path or "\0" in path:
    raise ToolError(f"{kind}: expected a non-empty path string (relative to {ROOT})")
  full = os.path.normpath(os.path.join(ROOT, path))
  if full != ROOT and not full.startswith(ROOT + "/"):
    raise ToolError(f"{kind} {path!r}: outside the checkout ({ROOT})")
  real = os.path.realpath(full)
  if real != ROOT and not real.startswith(ROOT + "/"):
    raise ToolError(f"{kind} {path!r}: resolves outside the checkout through a symlink")
  rel = os.path.relpath(full, ROOT)
  if rel.split("/")[0] == ".git" or os.path.relpath(real, ROOT).split("/")[0] == ".git":
    raise ToolError(f"{kind} {path!r}: the .git directory is not for the file tools")
  return full, rel


def _read_text(full, rel):
  try:
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
  except FileNotFoundError:
    raise ToolError(f"path {rel!r}: no such file") from None
  except OSError as e:
    raise ToolError(f"path {rel!r}: cannot open ({e.strerror})") from None
  with os.fdopen(fd, "rb") as f:
    data = f.read()
  if b"\0" in data[:8192]:
    raise ToolError(f"path {rel!r}: a binary file")
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    raise ToolError(f"path {rel!r}: not UTF-8 text") from None


def _write_text(full, text, create_only):
  flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | (os.O_EXCL if create_only else 0)
  fd = os.open(full, flags, 0o644)
  with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
    f.write(text)


def _numbered(lines, first):
  out = []
  for i, line in enumerate(lines, first):
    if len(line) > MAX_LINE_CHARS * 5:
      line = line[:MAX_LINE_CHARS * 5] + " ...[line cut]"
    out.append(f"{i:6d}\t{line}")
  return "\n".join(out)


def _int(args, key, default):
  value = args.get(key, default)
  if value is None:
    return None
  if not isinstance(value, int) or isinstance(value, bool):
    raise ToolError(f"{key}: expected an integer, got {value!r}")
  return value


def view(args):
  full, rel = _resolve(args.get("path"))
  if os.path.isdir(full):
    names = []
    with os.scandir(full) as it:
      for entry in it:
        if entry.name == ".git":
          continue
        names.append(entry.name + ("/" if entry.is_dir(follow_symlinks=False) else ""))
        if len(names) > 1000:
          break
    names.sort()
    more = "\n... (more entries)" if len(names) > 1000 else ""
    return {"output": "\n".join(names[:1000]) + more, "kind": "dir"}
  lines = _read_text(full, rel).split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  start, end = _int(args, "start", 1), _int(args, "end", None)
  if start < 1:
    raise ToolError(f"start: lines are numbered from 1, got {start}")
  if start > max(len(lines), 1):
    raise ToolError(f"start: {start} is past the end of {rel!r} ({len(lines)} lines)")
  end = len(lines) if end is None or end == -1 else end
  if end < start:
    raise ToolError(f"end: {end} is before start {start}")
  end = min(end, len(lines), start + MAX_VIEW_LINES - 1)
  text = _numbered(lines[start - 1:end], start)
  truncated = len(text) > MAX_OUTPUT_CHARS
  return {"output": text[:MAX_OUTPUT_CHARS], "kind": "file", "start": start, "end": end,
          "total_lines": len(lines), "truncated": truncated}


def edit(args):
  full, rel = _resolve(args.get("path"))
  old, new = args.get("old_str"), args.get("new_str")
  if not isinstance(old, str) or not old:
    raise ToolError("old_str: expected the non-empty text to replace")
  if not isinstance(new, str):
    raise ToolError("new_str: expected the replacement text (a string; '' deletes)")
  if os.path.islink(full) or not os.path.isfile(full):
    raise ToolError(f"path {rel!r}: not a regular file (create it first)")
  text = _read_text(full, rel)
  count = text.count(old)
  if count == 0:
    raise ToolError(f"old_str: not found in {rel!r} (it must match exactly, whitespace included)")
  if count > 1:
    lines, at = [], -1
    for _ in range(min(count, 10)):
      at = text.index(old, at + 1)
      lines.append(str(text.count("\n", 0, at) + 1))
    raise ToolError(f"old_str: occurs {count} times in {rel!r} (at lines {', '.join(lines)}); "
                    "include more context so it matches exactly once")
  at = text.index(old)
  text = text[:at] + new + text[at + len(old):]
  _write_text(full, text, create_only=False)
  first = text.count("\n", 0, at) + 1
  last = first + new.count("\n")
  lines = text.split("\n")
  lo, hi = max(first - 3, 1), min(last + 3, len(lines))
  return {"output": _numbered(lines[lo - 1:hi], lo), "first_line": first, "last_line": last}


def create(args):
  full, rel = _resolve(args.get("path"))
  content = args.get("content")
  if not isinstance(content, str):
    raise ToolError("content: expected the file's text (a string)")
  overwrite = args.get("overwrite", False)
  if not isinstance(overwrite, bool):
    raise ToolError(f"overwrite: expected true or false, got {overwrite!r}")
  if os.path.isdir(full):
    raise ToolError(f"path {rel!r}: a directory")
  if os.path.lexists(full) and not overwrite:
    raise ToolError(f"path {rel!r}: already exists (pass overwrite=true, or use edit)")
  parent = os.path.dirname(full)
  _resolve(os.path.relpath(parent, ROOT) if parent != ROOT else ".", "parent directory")
  try:
    os.makedirs(parent, exist_ok=True)
    _write_text(full, content, create_only=not overwrite)
  except OSError as e:
    raise ToolError(f"path {rel!r}: cannot write ({e.strerror})") from None
  return {"output": f"wrote {rel} ({len(content.encode('utf-8'))} bytes)"}


def search(args):
  pattern = args.get("pattern")
  if not isinstance(pattern, str) or not pattern:
    raise ToolError("pattern: expected a non-empty string")
  use_regex, ignore_case = args.get("regex", False), args.get("ignore_case", False)
  if not isinstance(use_regex, bool) or not isinstance(ignore_case, bool):
    raise ToolError("regex, ignore_case: expected true or false")
  max_results = _int(args, "max_results", 100)
  if not 1 <= max_results <= 1000:
    raise ToolError(f"max_results: expected 1..1000, got {max_results}")
  try:
    rx = re.compile(pattern if use_regex else re.escape(pattern), re.I if ignore_case else 0)
  except re.error as e:
    raise ToolError(f"pattern: not a valid regular expression ({e})") from None
  full, rel = _resolve(args.get("path", "."))
  files = [full] if os.path.isfile(full) else []
  if os.path.isdir(full):
    stack, seen = [full], 0
    while stack and seen < MAX_WALK_ENTRIES:
      d = stack.pop()
      try:
        entries = sorted(os.scandir(d), key=lambda e: e.name, reverse=True)
      except OSError:
        continue
      for e in entries:
        seen += 1
        if e.name == ".git":
          continue
        if e.is_dir(follow_symlinks=False):
          stack.append(e.path)
        elif e.is_file(follow_symlinks=False):
          files.append(e.path)
    files.sort()
  out, truncated = [], False
  for path in files:
    try:
      if os.path.getsize(path) > MAX_SEARCH_FILE_BYTES:
        continue
      with open(path, "rb") as f:
        data = f.read()
    except OSError:
      continue
    if b"\0" in data[:8192]:
      continue
    for no, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
      if rx.search(line):
        if len(out) >= max_results:
          truncated = True
          break
        out.append(f"{os.path.relpath(path, ROOT)}:{no}:{line[:MAX_LINE_CHARS]}")
    if truncated:
      break
  return {"output": "\n".join(out), "matches": len(out), "truncated": truncated}


TOOLS = {"view": view, "edit": edit, "create": create, "search": search}


def main():
  try:
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    tool, args = request["tool"], request["args"]
    if tool not in TOOLS:
      raise ToolError(f"tool {tool!r}: unknown (one of {sorted(TOOLS)})")
    if not isinstance(args, dict):
      raise ToolError("args: expected a JSON object")
    answer = {"ok": True, **TOOLS[tool](args)}
  except ToolError as e:
    answer = {"ok": False, "error": str(e)}
  sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
  main()

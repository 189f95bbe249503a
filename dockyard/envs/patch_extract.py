"""Pulls a unified diff out of a model's completion and normalizes it for `git apply -p1`.

Order: the first fenced ```diff / ```patch block (or any fenced block) that parses as a unified diff,
else the raw text from its first `diff --git` / `--- ` line. Normalization: LF line ends, a final
newline, `a/` and `b/` prefixes added where a header lacks them, prose after the last hunk dropped
(hunk line counts decide where a hunk ends). When the header counts do not fit the body, they are
recounted from the body, as `git apply --recount` does. Anything that still does not parse is malformed.
"""
from __future__ import annotations

import dataclasses
import re

import unidiff

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclasses.dataclass
class Extracted:
  patch: str | None
  reason: str = ""                    # why there is no patch, when patch is None
  files: tuple[str, ...] = ()         # target paths the patch touches


def _prefix(path: str, side: str) -> str:
  if path == "/dev/null" or path.startswith(f"{side}/"):
    return path
  return f"{side}/{path}"


def _trim_and_prefix(text: str) -> str:
  """Keeps file headers and hunks (by their line counts), drops anything else, adds a/ b/."""
  lines = text.split("\n")
  out, i = [], 0
  while i < len(lines):
    line = lines[i]
    if line.startswith("diff --git "):
      out.append(line)
    elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
      old = line[4:].split("\t")[0].strip()
      new = lines[i + 1][4:].split("\t")[0].strip()
      out += [f"--- {_prefix(old, 'a')}", f"+++ {_prefix(new, 'b')}"]
      i += 1
    elif (m := _HUNK.match(line)):
      old_left = int(m.group(2) or 1) if m.group(2) != "0" else 0
      new_left = int(m.group(4) or 1) if m.group(4) != "0" else 0
      out.append(line)
      i += 1
      while i < len(lines) and (old_left > 0 or new_left > 0):
        body = lines[i]
        if body.startswith("\\"):
          out.append(body)
        elif body.startswith("-"):
          old_left -= 1; out.append(body)
        elif body.startswith("+"):
          new_left -= 1; out.append(body)
        elif body.startswith(" ") or body == "":
          old_left -= 1; new_left -= 1; out.append(body if body else " ")
        else:
          break  # prose inside a hunk: the hunk is short; unidiff will reject it
        i += 1
      if i < len(lines) and lines[i].startswith("\\"):
        out.append(lines[i]); i += 1
      continue
    elif line.startswith(("index ", "new file mode", "deleted file mode", "old mode", "new mode",
                          "similarity index", "rename from", "rename to", "Binary files", "GIT binary")):
      out.append(line)
    i += 1
  return "\n".join(out).rstrip("\n") + "\n"


def _is_body(line: str) -> bool:
  return line[:1] in (" ", "-", "+", "\\") or line == ""


def _recount(text: str) -> str:
  """Rewrites each hunk header's line counts from the body that follows it (`git apply --recount`).

  Why: a model often gets the body right and the counts wrong (a sampled digit); such a hunk is
  still a precise edit. The body ends at the next header (`@@`, `--- `+`+++ `, `diff --git`) or at
  the first line that is not a hunk line; a trailing blank line is not counted."""
  lines = text.split("\n")
  out, i = [], 0
  while i < len(lines):
    m = _HUNK.match(lines[i])
    if not m:
      out.append(lines[i]); i += 1
      continue
    j, body = i + 1, []
    while j < len(lines) and _is_body(lines[j]) and not lines[j].startswith("@@"):
      if (lines[j].startswith("--- ") and j + 1 < len(lines) and lines[j + 1].startswith("+++ ")):
        break
      body.append(lines[j]); j += 1
    while body and body[-1] == "":
      body.pop()
    old = sum(1 for b in body if b[:1] in (" ", "-", ""))
    new = sum(1 for b in body if b[:1] in (" ", "+", ""))
    out.append(f"@@ -{m.group(1)},{old} +{m.group(3)},{new} @@")
    out += [b if b else " " for b in body]
    i = j
  return "\n".join(out)


def _parse(candidate: str) -> Extracted | None:
  if "@@" not in candidate:
    return None
  candidate = candidate.replace("\r\n", "\n")
  # The header counts first; when they do not fit the body, the body's own counts.
  for text in (_trim_and_prefix(candidate), _trim_and_prefix(_recount(candidate))):
    try:
      patch_set = unidiff.PatchSet(text)
    except unidiff.UnidiffParseError:
      continue
    if len(patch_set) and any(f.added or f.removed for f in patch_set):   # an edit, not just headers
      return Extracted(patch=text, files=tuple(f.path for f in patch_set))
  return None


def extract_patch(completion: str) -> Extracted:
  if not completion or not completion.strip():
    return Extracted(None, "empty completion")
  blocks = _FENCE.findall(completion)
  preferred = [b for lang, b in blocks if lang.lower() in ("diff", "patch", "udiff")]
  for block in preferred + [b for lang, b in blocks if lang.lower() not in ("diff", "patch", "udiff")]:
    got = _parse(block)
    if got:
      return got
  m = re.search(r"^(diff --git |--- )", completion, re.M)
  if m:
    got = _parse(completion[m.start():])
    if got:
      return got
    return Extracted(None, "diff found but it does not parse as a unified diff")
  return Extracted(None, "no unified diff in the completion" + (" (fenced block did not parse)" if blocks else ""))


def compact_patch(patch: str, context: int = 1) -> str:
  """The same edit as `patch` in fewer tokens: `--- a/` / `+++ b/` headers only (no `diff --git`,
  no `index <hash>..<hash>` line) and at most `context` unchanged lines around each change.

  Why: this is the SFT target, and a tiny model has to reproduce every token of it; the hash line
  alone is ~80 tokens of noise. `git apply` accepts hunks with less context (their line numbers are
  recomputed here), so the compact patch applies exactly where the original does.
  """
  if context < 0:
    raise ValueError(f"context must be >= 0, got {context}")
  out = []
  for f in unidiff.PatchSet(patch):
    out += [f"--- {_prefix(f.source_file, 'a')}", f"+++ {_prefix(f.target_file, 'b')}"]
    for h in f:
      lines = list(h)
      changed = [i for i, ln in enumerate(lines) if not ln.is_context]
      if not changed:
        continue
      lo, hi = max(0, changed[0] - context), min(len(lines), changed[-1] + context + 1)
      skipped = lines[:lo]
      src_start = h.source_start + sum(1 for ln in skipped if not ln.is_added)
      tgt_start = h.target_start + sum(1 for ln in skipped if not ln.is_removed)
      kept = lines[lo:hi]
      n_src = sum(1 for ln in kept if not ln.is_added)
      n_tgt = sum(1 for ln in kept if not ln.is_removed)
      out.append(f"@@ -{src_start},{n_src} +{tgt_start},{n_tgt} @@")
      out += [f"{ln.line_type}{ln.value.rstrip(chr(10))}" for ln in kept]
  return "\n".join(out) + "\n"

"""Helpers shared by the session tests: the gold fix as an edit, and a process probe by marker."""
import os

FIX = {"path": "calc/core.py", "old_str": "return a - b\n\n\ndef sub",
       "new_str": "return a + b\n\n\ndef sub"}


def processes_with(marker: str) -> list[str]:
  """Live processes whose command line holds `marker` (other jobs on the machine do not)."""
  out = []
  for pid in os.listdir("/proc"):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read()
      with open(f"/proc/{pid}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
      continue
    if marker.encode() in cmd and state != "Z" and int(pid) != os.getpid():
      out.append(f"{pid} {cmd[:80]!r}")
  return out

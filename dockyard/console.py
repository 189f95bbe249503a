"""What the terminal shows, what the run log keeps, and the progress lines of the long phases.

`capture(log_path)` (the launcher, once the workdir exists) puts a `Tee` on `sys.stdout` and
`sys.stderr`: everything written through them (dockyard's output, Ray's driver log, the lines Ray
forwards from its actors such as the vLLM engines and the sandbox servers, Python warnings,
logging) is appended to `<workdir>/run.log`, and the terminal gets the same minus the lines
`is_noise` names: third-party chatter, never an error. Progress (`bar` for counted work, `phase`
for work with no count) draws on the real terminal, and each phase's outcome also goes to the log.
"""
from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
import threading
import time
import traceback
from typing import Iterator, TextIO

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# A line Ray forwards from an actor or task: "(EngineActorImpl pid=20364) ..." (ip= on clusters).
_WORKER = re.compile(r"^\((?P<actor>[\w.:-]+) pid=\d+(?:, ip=[\w.:-]+)?\) ?")
_ERRORISH = re.compile(r"Traceback|Error|Exception|ERROR|CRITICAL|FATAL|Killed|out of memory|dockyard")
# warnings.showwarning's first line ("path.py:12: FutureWarning: ..."); the next is the source line.
_PY_WARNING = re.compile(r"^\S.*:\d+: [A-Z]\w*Warning: ")
# Ray's own driver log ("2026-12-04 03:59:56,208\tWARNING authentication_token_setup.py:85 -- ...").
_RAY_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(DEBUG|INFO|WARNING) \S+:\d+ -- ")
# c10 / glog-style INFO and WARNING lines ("[W1204 04:00:25.289005847 utils.cpp:68] Warning: ...").
_CPP_LOG = re.compile(r"^\[[IW]\d{4} \d\d:\d\d:\d\d")


def is_noise(line: str, after_warning: bool = False) -> bool:
  """Whether the terminal should skip `line` (it still goes to the run log).

  Noise: a Python warning and its source line (`after_warning`: the line before was a warning),
  Ray's INFO/WARNING lines, c10 INFO/WARNING lines, and what Ray forwards from actors unless it
  looks like an error or is dockyard's own.
  """
  text = _ANSI.sub("", line).rstrip("\r\n")
  worker = _WORKER.match(text)
  if worker:
    return not _ERRORISH.search(text[worker.end():])
  if after_warning and text[:1] in (" ", "\t"):
    return True
  return bool(_PY_WARNING.match(text) or _RAY_LOG.match(text) or _CPP_LOG.match(text))


class Tee(io.TextIOBase):
  """A text stream that appends everything to `log` and passes the non-noise lines to `terminal`.

  Whole lines are judged (a line ends at "\\n": a line Ray forwards may hold a "\\r" after its
  prefix); a partial line waits for its end, or for `close`.
  """

  def __init__(self, terminal: TextIO, log: TextIO):
    self.terminal, self.log = terminal, log
    self._pending = ""
    self._after_warning = False
    self._lock = threading.Lock()

  def writable(self) -> bool:
    return True

  def isatty(self) -> bool:
    return False   # third-party progress bars that check draw plain lines into the log

  @property
  def encoding(self):
    return getattr(self.terminal, "encoding", "utf-8")

  def fileno(self) -> int:
    return self.terminal.fileno()

  def write(self, s: str) -> int:
    with self._lock:
      self.log.write(s)
      self._pending += s
      lines = self._pending.split("\n")
      lines = [line + "\n" for line in lines[:-1]] + lines[-1:]
      self._pending = lines.pop()   # "" when s ended a line
      for line in lines:
        self._show(line)
    return len(s)

  def _show(self, line: str) -> None:
    noise = is_noise(line, self._after_warning)
    self._after_warning = bool(_PY_WARNING.match(_ANSI.sub("", line)))
    if not noise:
      self.terminal.write(line)

  def flush(self) -> None:
    with self._lock:
      self.log.flush()
      self.terminal.flush()

  def close(self) -> None:
    with self._lock:
      if self._pending:
        self._show(self._pending)
        self._pending = ""
    self.flush()


_terminal: TextIO | None = None    # the real stderr while `capture` is on
_log: TextIO | None = None


def terminal() -> TextIO:
  """Where progress draws: the real stderr (under `capture` too)."""
  return _terminal if _terminal is not None else sys.stderr


def note(line: str) -> None:
  """`line` in the run log (when one is open), not on the terminal."""
  if _log is not None:
    _log.write(line.rstrip("\n") + "\n")


@contextlib.contextmanager
def capture(log_path: str) -> Iterator[None]:
  """Tees sys.stdout / sys.stderr into `log_path` (appended: a resumed run adds to it) for the
  block, with the noise kept off the terminal; an exception's traceback goes to the log too."""
  global _terminal, _log
  if _terminal is not None:
    raise RuntimeError("console.capture is already on")
  log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")
  log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")
  saved = sys.stdout, sys.stderr
  out, err = Tee(sys.stdout, log), Tee(sys.stderr, log)
  _terminal, _log = saved[1], log
  sys.stdout, sys.stderr = out, err
  # Logging handlers made before now (absl's) hold the real streams: point them at the tees.
  moved = [(h, h.stream) for h in _stream_handlers() if h.stream in saved]
  for h, stream in moved:
    h.setStream(out if stream is saved[0] else err)
  try:
    yield
  except BaseException:
    log.write(traceback.format_exc())
    raise
  finally:
    for h, stream in moved:
      h.setStream(stream)
    out.close()
    err.close()
    sys.stdout, sys.stderr = saved
    _terminal = _log = None
    log.close()


def _stream_handlers() -> list[logging.StreamHandler]:
  """The root logger's stream handlers, absl's included (its ABSLHandler wraps one)."""
  out = []
  for h in logging.getLogger().handlers:
    h = getattr(h, "python_handler", h)
    if isinstance(h, logging.StreamHandler):
      out.append(h)
  return out


def bar(total: int, desc: str, initial: int = 0, enabled: bool = True):
  """A tqdm bar on the terminal for `total` counted pieces of work, or None when not `enabled`."""
  if not enabled:
    return None
  from tqdm import tqdm
  return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, file=terminal())


@contextlib.contextmanager
def phase(desc: str, enabled: bool = True) -> Iterator[None]:
  """One terminal line for work with no count (engine start-up): on a TTY it counts the seconds
  while the block runs; then it says how long the block took, or that it failed."""
  if not enabled:
    yield
    return
  out, t0 = terminal(), time.perf_counter()
  tty = out.isatty()
  stop = threading.Event()

  def tick():
    while not stop.wait(1.0):
      out.write(f"\r{desc} ... {time.perf_counter() - t0:.0f} s")
      out.flush()

  ticker = threading.Thread(target=tick, name="console.phase", daemon=True)
  if tty:
    out.write(f"{desc} ...")
    out.flush()
    ticker.start()
  outcome = "failed after"
  try:
    yield
    outcome = "done in"
  finally:
    stop.set()
    if tty:
      ticker.join()
    line = f"{desc}: {outcome} {time.perf_counter() - t0:.1f} s"
    out.write(("\r\x1b[K" if tty else "") + line + "\n")
    out.flush()
    note(line)

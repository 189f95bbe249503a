"""`local_executor(...)`: one real executor server in a subprocess on 127.0.0.1, for tests and tools.

  with local_executor(repos_dir=d, slots=2) as url:
    verdicts = asyncio.run(SandboxClient([url]).run_many(tasks))

The server is `python -m dockyard.sandbox.server` on a free port; the context waits for /healthz
and kills its process group on exit. `start_local_executor` returns a handle with `.kill()`
(the client's failover tests kill one mid-batch).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port(host: str = "127.0.0.1") -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


@dataclasses.dataclass
class LocalExecutor:
  url: str
  process: subprocess.Popen

  def kill(self) -> None:
    """Kills the server and everything it started (its process group)."""
    if self.process.poll() is None:
      try:
        os.killpg(self.process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    self.process.wait()


def start_local_executor(slots: int = 1, repos_dir: str | None = None,
                         cache_dir: str | None = None, queue_size: int = 1024,
                         limits: dict | None = None, port: int | None = None,
                         startup_timeout_s: float = 60.0, log_path: str | None = None,
                         sessions: dict | None = None) -> LocalExecutor:
  """`limits`: Limits fields; `sessions`: SessionLimits fields (both JSON on the command line)."""
  port = port or free_port()
  argv = [sys.executable, "-m", "dockyard.sandbox.server", "--host", "127.0.0.1",
          "--port", str(port), "--slots", str(slots), "--queue-size", str(queue_size),
          "--limits", json.dumps(dict(limits or {})),
          "--sessions", json.dumps(dict(sessions or {}))]
  if repos_dir:
    argv += ["--repos-dir", repos_dir]
  if cache_dir:
    argv += ["--cache-dir", cache_dir]
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([_PKG_ROOT] + [p for p in env.get(
      "PYTHONPATH", "").split(os.pathsep) if p])
  log = open(log_path, "ab") if log_path else subprocess.DEVNULL
  proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                          start_new_session=True)
  url = f"http://127.0.0.1:{port}"
  handle = LocalExecutor(url, proc)
  deadline = time.monotonic() + startup_timeout_s
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"the executor server exited with {proc.returncode} at start-up"
                         + (f"; see {log_path}" if log_path else ""))
    try:
      if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
        return handle
    except httpx.TransportError:
      pass
    time.sleep(0.1)
  handle.kill()
  raise RuntimeError(f"the executor server did not answer /healthz within {startup_timeout_s} s")


@contextlib.contextmanager
def local_executor(**kw):
  """Starts one executor server on 127.0.0.1 (a free port) and yields its URL."""
  handle = start_local_executor(**kw)
  try:
    yield handle.url
  finally:
    handle.kill()

"""The executor's HTTP server (FastAPI): submit tasks, poll or wait for verdicts, health, metrics.

  python -m dockyard.sandbox.server --port 9090 --slots 2 [--repos-dir DIR] [--host 0.0.0.0]

  POST /task/submit   a task or a list of tasks -> {"ids": [...]}; 429 when the queue is full
  GET  /task/{id}     {"id", "status": queued|running|done, "verdict"}; ?wait=S blocks up to S s
  POST /task/wait     {"ids": [...], "timeout": S} -> the same records once all are done (or S)
  GET  /healthz       {"ok", "slots", "queued", "running", "sessions"}
  GET  /metrics       Prometheus text
  /session...         live agent sessions (session_api.py; docs/agent-sessions.md)

The queue is bounded (back-pressure: a batch that does not fit is refused whole with 429); at
most `slots` tasks run at once; finished records are kept for the newest `keep_done` tasks only,
so memory stays bounded under any load.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import time
import uuid

import fastapi
from fastapi.responses import JSONResponse, PlainTextResponse

from dockyard.sandbox.session_api import add_session_routes
from dockyard.sandbox.sessions import SessionLimits, SessionManager
from dockyard.sandbox.task import TaskError, parse_task

MAX_WAIT_S = 300.0


@dataclasses.dataclass
class _Record:
  task: dict | None
  status: str = "queued"
  verdict: dict | None = None
  submitted: float = dataclasses.field(default_factory=time.monotonic)
  done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

  def public(self, task_id: str) -> dict:
    return {"id": task_id, "status": self.status, "verdict": self.verdict}


class _State:

  def __init__(self, executor, queue_size: int, keep_done: int):
    self.executor = executor
    self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=queue_size)
    self.records: dict[str, _Record] = {}
    self.finished: collections.deque[str] = collections.deque()
    self.keep_done = keep_done
    self.counters = collections.Counter()
    self.busy_s = 0.0
    self.workers: list[asyncio.Task] = []

  def enqueue(self, tasks: list) -> list[str] | None:
    """Queues validated tasks whole, or none (None) when they do not all fit."""
    if self.queue.maxsize - self.queue.qsize() < len(tasks):
      self.counters["rejected_total"] += len(tasks)
      return None
    ids = []
    for task in tasks:
      task_id = uuid.uuid4().hex
      self.records[task_id] = _Record(task)
      self.queue.put_nowait(task_id)
      ids.append(task_id)
    self.counters["submitted_total"] += len(ids)
    return ids

  async def worker(self) -> None:
    while True:
      task_id = await self.queue.get()
      rec = self.records.get(task_id)
      if rec is None:
        continue
      rec.status = "running"
      start = time.monotonic()
      try:
        rec.verdict = await self.executor.run(rec.task)
        self.counters["resolved_total"] += bool(rec.verdict.get("resolved"))
      except Exception as e:  # a verdict always comes back, even from an executor fault
        rec.verdict = {"instance_id": rec.task.get("instance_id"), "resolved": False,
                       "reward": 0.0, "pass_rate": 0.0, "tests_status": {},
                       "findings": ["executor_error"], "patch_applied": False,
                       "apply_method": None, "reason": f"executor error: {e}", "timings": {},
                       "log_head": "", "log_tail": ""}
        self.counters["errors_total"] += 1
      self.busy_s += time.monotonic() - start
      rec.status, rec.task = "done", None
      rec.done.set()
      self.counters["completed_total"] += 1
      self.finished.append(task_id)
      while len(self.finished) > self.keep_done:
        self.records.pop(self.finished.popleft(), None)


def _error(status: int, message: str) -> JSONResponse:
  return JSONResponse({"error": message}, status_code=status)


def _parse_body(raw: bytes):
  """The JSON body, or a 400 response: invalid JSON, or nested too deep for the parser (a
  RecursionError, which escaped as a 500 and a reset connection)."""
  try:
    return json.loads(raw)
  except (ValueError, UnicodeDecodeError) as e:
    return _error(400, f"body: not valid JSON ({e})")
  except RecursionError:
    return _error(400, "body: JSON nested too deeply")


def make_app(executor, queue_size: int = 1024, keep_done: int = 10000,
             session_limits: SessionLimits | None = None) -> fastapi.FastAPI:
  """The FastAPI app around one `Executor`; its workers (and the session reaper) start with the
  app's lifespan."""
  if queue_size < 1:
    raise ValueError(f"queue_size: expected >= 1, got {queue_size}")
  state = _State(executor, queue_size, keep_done)
  sessions = SessionManager(executor, session_limits)

  async def lifespan(app):
    state.workers = [asyncio.create_task(state.worker()) for _ in range(executor.slots)]
    reaper = asyncio.create_task(sessions.reap_forever())
    yield
    reaper.cancel()
    await sessions.close_all()
    for w in state.workers:
      w.cancel()

  app = fastapi.FastAPI(title="dockyard sandbox executor", lifespan=lifespan)
  app.state.sandbox = state
  app.state.sessions = sessions
  add_session_routes(app, sessions, state)

  @app.post("/task/submit")
  async def submit(request: fastapi.Request):
    body = _parse_body(await request.body())
    if isinstance(body, JSONResponse):
      return body
    tasks = body if isinstance(body, list) else [body]
    if not tasks:
      return _error(422, "body: an empty list of tasks")
    for i, task in enumerate(tasks):
      try:
        parse_task(task)
      except TaskError as e:
        where = f"task[{i}] " if isinstance(body, list) else ""
        return _error(422, f"{where}{e}")
    ids = state.enqueue(tasks)
    if ids is None:
      return _error(429, f"queue full ({state.queue.qsize()}/{state.queue.maxsize} queued); "
                         "retry later")
    return {"ids": ids}

  @app.get("/task/{task_id}")
  async def get_task(task_id: str, wait: float = 0.0):
    rec = state.records.get(task_id)
    if rec is None:
      return _error(404, f"task {task_id!r}: unknown (never submitted here, or evicted)")
    if wait > 0 and not rec.done.is_set():
      try:
        await asyncio.wait_for(rec.done.wait(), min(wait, MAX_WAIT_S))
      except asyncio.TimeoutError:
        pass
    return rec.public(task_id)

  @app.post("/task/wait")
  async def wait_tasks(request: fastapi.Request):
    body = _parse_body(await request.body())
    if isinstance(body, JSONResponse):
      return body
    try:
      ids, timeout = body["ids"], float(body.get("timeout", 30.0))
      if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise TypeError("ids must be a list of strings")
      if not 0 <= timeout < float("inf"):
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      return _error(422, f"body: expected {{'ids': [...], 'timeout': seconds}} ({e})")
    unknown = [i for i in ids if i not in state.records]
    if unknown:
      return _error(404, f"unknown task ids: {unknown[:5]}")
    recs = [state.records[i] for i in ids]
    try:
      await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in recs)),
                             min(timeout, MAX_WAIT_S))
    except asyncio.TimeoutError:
      pass
    return {"tasks": [r.public(i) for i, r in zip(ids, recs)]}

  @app.get("/healthz")
  async def healthz():
    return {"ok": True, "slots": executor.slots, "queued": state.queue.qsize(),
            "running": executor.running, "sessions": len(sessions.sessions)}

  @app.get("/metrics", response_class=PlainTextResponse)
  async def metrics():
    lines = []
    for name in ("submitted_total", "completed_total", "rejected_total", "resolved_total",
                 "errors_total"):
      lines.append(f"# TYPE dockyard_sandbox_{name} counter")
      lines.append(f"dockyard_sandbox_{name} {state.counters[name]}")
    gauges = {"queued": state.queue.qsize(), "running": executor.running,
              "slots": executor.slots, "records": len(state.records)}
    for name, value in gauges.items():
      lines.append(f"# TYPE dockyard_sandbox_{name} gauge")
      lines.append(f"dockyard_sandbox_{name} {value}")
    for name, value in sorted(sessions.counters.items()):
      lines.append(f"# TYPE dockyard_sandbox_{name} counter")
      lines.append(f"dockyard_sandbox_{name} {value}")
    lines.append("# TYPE dockyard_sandbox_sessions gauge")
    lines.append(f"dockyard_sandbox_sessions {len(sessions.sessions)}")
    lines.append("# TYPE dockyard_sandbox_busy_seconds_total counter")
    lines.append(f"dockyard_sandbox_busy_seconds_total {state.busy_s:.3f}")
    return "\n".join(lines) + "\n"

  return app


def main(argv: list[str] | None = None) -> None:
  import uvicorn

  from dockyard.sandbox.executor import Executor, Limits
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--host", default="127.0.0.1")
  parser.add_argument("--port", type=int, default=9090)
  parser.add_argument("--slots", type=int, default=0, help="0: the machine's cores")
  parser.add_argument("--queue-size", type=int, default=1024)
  parser.add_argument("--repos-dir", default=None)
  parser.add_argument("--cache-dir", default=None)
  parser.add_argument("--limits", default="{}", help="JSON object of Limits fields")
  parser.add_argument("--sessions", default="{}", help="JSON object of SessionLimits fields")
  args = parser.parse_args(argv)
  limits = Limits(**json.loads(args.limits))
  executor = Executor(repos_dir=args.repos_dir, cache_dir=args.cache_dir,
                      slots=args.slots or None, limits=limits)
  app = make_app(executor, queue_size=args.queue_size,
                 session_limits=SessionLimits(**json.loads(args.sessions)))
  uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
  main()

"""The executor server's session routes (see sessions.py for what a session is; docs/agent-sessions.md).

  POST   /session                    a task record (or {"task": record}) -> {"id", ...}; 429 when full
  GET    /session/{id}               {"id", "instance_id", "age_s", "idle_s", "commands", "busy"}
  POST   /session/{id}/exec          {"command", "timeout"?} -> {"exit_code", "timed_out",
                                     "stdout", "stderr", "stdout_truncated", "stderr_truncated", ...}
  POST   /session/{id}/tools/{name}  view {path, start?, end?} | edit {path, old_str, new_str} |
                                     create {path, content, overwrite?} |
                                     search {pattern, path?, regex?, ignore_case?, max_results?}
  POST   /session/{id}/diff          {"patch"}: the working tree against the base (nothing graded)
  POST   /session/{id}/submit        {"wait"?: S} -> {"session", "patch", "id", "status", "verdict"}
  DELETE /session/{id}               {"id", "deleted": true}

A terminal task (`"kind": "terminal"`: a starting directory from a spec, a checker) has no diff:
submit runs its checker in the session as the agent left it and answers the verdict at once
({"session", "patch": null, "id": null, "status": "done", "verdict"}); then the session ends.

Submit (of a SWE task) computes the diff in the session, queues it as an ordinary task (the same queue, slots and
stored records as POST /task/submit, so the verdict is graded in a fresh checkout and kept like
any other: GET /task/{id}), then ends the session. Errors are {"error": message} with 4xx: 400
for a body that is not JSON, 404 for an unknown session or tool, 410 for an ended one (with the
reason, a submitted one naming its task id), 413 for an oversized command, body or diff, 422 for
a bad field, path or edit, 429 when the session limit or the queue is full.
"""
from __future__ import annotations

import asyncio
import json

import fastapi
from fastapi.responses import JSONResponse

from dockyard.sandbox.sessions import SessionError, SessionManager

MAX_BODY_BYTES = 16 << 20
MAX_WAIT_S = 300.0


def _error(status: int, message: str) -> JSONResponse:
  return JSONResponse({"error": message}, status_code=status)


async def _body(request: fastapi.Request, empty_ok: bool = False):
  raw = await request.body()
  if len(raw) > MAX_BODY_BYTES:
    raise SessionError(413, f"body: {len(raw)} bytes, more than {MAX_BODY_BYTES}")
  if empty_ok and not raw.strip():
    return {}
  try:
    body = json.loads(raw)
  except (ValueError, UnicodeDecodeError) as e:
    raise SessionError(400, f"body: not valid JSON ({e})") from None
  except RecursionError:
    raise SessionError(400, "body: JSON nested too deeply") from None
  if not isinstance(body, dict):
    raise SessionError(422, f"body: expected a JSON object, got {type(body).__name__}")
  return body


def _wait_s(body: dict) -> float:
  wait = body.get("wait", 0.0)
  if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= MAX_WAIT_S:
    raise SessionError(422, f"wait: expected seconds in [0, {MAX_WAIT_S:g}], got {wait!r}")
  return float(wait)


def add_session_routes(app: fastapi.FastAPI, manager: SessionManager, state) -> None:
  """`state` is the server's: `enqueue(tasks) -> ids | None` (None: the queue is full) and
  `records` {task id: record with .done and .public(id)}."""

  @app.exception_handler(SessionError)
  async def session_error(request, exc: SessionError):
    return _error(exc.status, str(exc))

  @app.post("/session")
  async def create(request: fastapi.Request):
    return await manager.create(await _body(request))

  @app.get("/session/{sid}")
  async def info(sid: str):
    return manager.info(sid)

  @app.post("/session/{sid}/exec")
  async def exec_(sid: str, request: fastapi.Request):
    body = await _body(request)
    unknown = set(body) - {"command", "timeout"}
    if unknown:
      raise SessionError(422, f"body: unknown fields {sorted(unknown)} (command, timeout)")
    return await manager.exec(sid, body.get("command"), body.get("timeout"))

  @app.post("/session/{sid}/tools/{name}")
  async def tool(sid: str, name: str, request: fastapi.Request):
    return await manager.tool(sid, name, await _body(request))

  @app.post("/session/{sid}/diff")
  async def diff(sid: str):
    return {"patch": await manager.diff(sid)}

  @app.post("/session/{sid}/submit")
  async def submit(sid: str, request: fastapi.Request):
    wait = _wait_s(await _body(request, empty_ok=True))
    session = manager.get(sid)
    if session.terminal is not None:   # checked in place, after the agent's last command
      verdict = await manager.check(sid)
      try:
        await manager.close(sid, f"submitted; checked: reward {verdict['reward']:g}")
      except SessionError:
        pass
      manager.counters["sessions_submitted_total"] += 1
      return {"session": sid, "patch": None, "id": None, "status": "done", "verdict": verdict}
    patch = await manager.diff(sid)
    ids = state.enqueue([dict(session.task, patch=patch)])
    if ids is None:   # the session stays: the client retries the submit
      raise SessionError(429, "the grading queue is full; retry the submit later")
    task_id = ids[0]
    try:
      await manager.close(sid, f"submitted; its verdict is task {task_id} (GET /task/{task_id})")
    except SessionError:
      pass   # reaped or deleted meanwhile: the diff is queued all the same, answer with it
    manager.counters["sessions_submitted_total"] += 1
    rec = state.records[task_id]
    if wait > 0:
      try:
        await asyncio.wait_for(rec.done.wait(), wait)
      except asyncio.TimeoutError:
        pass
    return {"session": sid, "patch": patch, **rec.public(task_id)}

  @app.delete("/session/{sid}")
  async def delete(sid: str):
    await manager.close(sid, "deleted")
    return {"id": sid, "deleted": True}

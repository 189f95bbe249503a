"""`SandboxClient`: async client for one or more executors, with load spreading and failover.

  client = SandboxClient(["http://10.0.0.1:9090", "http://10.0.0.2:9090"], max_in_flight=256)
  verdicts = await client.run_many(tasks)
  await client.aclose()

Each task goes to the executor with the fewest tasks in flight from this client. Connection
errors, 5xx and 429 are retried with exponential backoff (tenacity); when an executor stays
unreachable, or forgets a task (404 after a restart), the task is resubmitted to another one.
Every request has a timeout and every task an overall deadline.

Agent sessions (`open_session` -> `AgentSession`: exec, tool, diff, submit, close) are pinned to
the executor that made them: a session's files live there only, so when that executor restarts or
stays unreachable the session is lost and `SessionLost` says so (no failover: start a new one).
A submitted diff is kept by the client, so a verdict is never lost: if the grading executor goes
away, the same diff is graded on another.
"""
from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from typing import Any, Sequence

import httpx
import tenacity


log = logging.getLogger(__name__)


class SandboxError(RuntimeError):
  """A task could not be graded by any executor before its deadline."""


class _Retryable(Exception):
  """A response worth retrying on the same executor (5xx, 429)."""


class _Lost(Exception):
  """The executor is unreachable or no longer knows the task: resubmit elsewhere."""


class SandboxClient:

  def __init__(self, urls: Sequence[str], request_timeout_s: float = 600.0,
               max_in_flight: int = 64, wait_s: float = 20.0, connect_timeout_s: float = 5.0,
               retry_attempts: int = 4, dead_cooldown_s: float = 10.0):
    urls = [urls] if isinstance(urls, str) else list(urls)
    if not urls:
      raise ValueError("urls: at least one executor URL is needed")
    for url in urls:
      if not url.startswith(("http://", "https://")):
        raise ValueError(f"urls: {url!r} is not an http(s) URL")
    if max_in_flight < 1:
      raise ValueError(f"max_in_flight: expected >= 1, got {max_in_flight}")
    self.urls = [u.rstrip("/") for u in urls]
    self.request_timeout_s = request_timeout_s   # one task, end to end
    self.wait_s = wait_s                           # one long-poll
    self.retry_attempts = retry_attempts
    self.dead_cooldown_s = dead_cooldown_s
    self._gate = asyncio.Semaphore(max_in_flight)
    self._load = {u: 0 for u in self.urls}
    self._dead_until = {u: 0.0 for u in self.urls}
    self._http = httpx.AsyncClient(
        timeout=httpx.Timeout(wait_s + 30.0, connect=connect_timeout_s),
        limits=httpx.Limits(max_connections=max(max_in_flight, 16) * 2,
                            max_keepalive_connections=max(max_in_flight, 16)))
    self.resubmissions = 0

  @classmethod
  def from_config(cls, config, urls: Sequence[str] | None = None) -> "SandboxClient":
    """From `config.env.code` (sandbox_urls, request_timeout_s, max_in_flight); `urls` (e.g.
    those `start_local_fleet` returned) replace sandbox_urls when given."""
    code = config.env.code
    return cls(list(urls or code.sandbox_urls), request_timeout_s=float(code.request_timeout_s),
               max_in_flight=int(code.max_in_flight))

  async def aclose(self) -> None:
    await self._http.aclose()

  async def __aenter__(self):
    return self

  async def __aexit__(self, *exc):
    await self.aclose()

  def _pick(self, avoid: set[str]) -> str:
    now = time.monotonic()
    alive = [u for u in self.urls if self._dead_until[u] <= now and u not in avoid]
    pool = alive or [u for u in self.urls if u not in avoid] or self.urls
    low = min(self._load[u] for u in pool)
    return random.choice([u for u in pool if self._load[u] == low])

  def _retrying(self):
    return tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type((httpx.TransportError, _Retryable)),
        wait=tenacity.wait_exponential_jitter(initial=0.2, max=5.0),
        stop=tenacity.stop_after_attempt(self.retry_attempts), reraise=True)

  async def _request(self, method: str, url: str, **kw) -> httpx.Response:
    async for attempt in self._retrying():
      with attempt:
        resp = await self._http.request(method, url, **kw)
        if resp.status_code >= 500 or resp.status_code == 429:
          raise _Retryable(f"{method} {url}: HTTP {resp.status_code}: {resp.text[:200]}")
    return resp

  async def _run_on(self, url: str, task: dict, deadline: float) -> dict:
    try:
      resp = await self._request("POST", f"{url}/task/submit", json=task)
    except (httpx.TransportError, _Retryable) as e:
      raise _Lost(str(e)) from e
    if resp.status_code >= 400:
      raise ValueError(f"executor refused task {task.get('instance_id')!r}: "
                       f"HTTP {resp.status_code}: {resp.text[:500]}")
    task_id = resp.json()["ids"][0]
    while True:
      left = deadline - time.monotonic()
      if left <= 0:
        raise SandboxError(f"task {task.get('instance_id')!r}: no verdict within "
                           f"{self.request_timeout_s} s")
      try:
        resp = await self._request("GET", f"{url}/task/{task_id}",
                                   params={"wait": min(self.wait_s, max(left, 0.1))})
      except (httpx.TransportError, _Retryable) as e:
        raise _Lost(str(e)) from e
      if resp.status_code == 404:
        raise _Lost(f"{url} no longer knows task {task_id}")
      resp.raise_for_status()
      record = resp.json()
      if record["status"] == "done":
        return record["verdict"]

  async def run(self, task: dict[str, Any]) -> dict:
    """Grades one task, on whichever executor can; raises SandboxError past the deadline."""
    async with self._gate:
      deadline = time.monotonic() + self.request_timeout_s
      tried: set[str] = set()
      while True:
        url = self._pick(tried)
        self._load[url] += 1
        try:
          return await self._run_on(url, task, deadline)
        except _Lost as e:
          log.warning("sandbox executor %s lost task %r (%s); resubmitting it to another executor",
                      url, task.get("instance_id"), str(e)[:200])
          self._dead_until[url] = time.monotonic() + self.dead_cooldown_s
          tried.add(url)
          if len(tried) >= len(self.urls):
            tried.clear()   # every executor failed once: try them all again after a pause
            await asyncio.sleep(1.0)
          if time.monotonic() >= deadline:
            raise SandboxError(f"task {task.get('instance_id')!r}: every executor failed")
          self.resubmissions += 1
        finally:
          self._load[url] -= 1

  async def run_many(self, tasks: Sequence[dict[str, Any]]) -> list[dict]:
    """Grades all tasks concurrently (at most max_in_flight at once); verdicts in task order."""
    return list(await asyncio.gather(*(self.run(t) for t in tasks)))

  # --- agent sessions (docs/agent-sessions.md) --------------------------------------------------

  async def open_session(self, task: dict[str, Any]) -> "AgentSession":
    """A live session for `task` on the least loaded executor that takes one. Creating fails over
    like a task (nothing lives anywhere yet); the session is then pinned to that executor."""
    tried: set[str] = set()
    errors = []
    while len(tried) < len(self.urls):
      url = self._pick(tried)
      tried.add(url)
      try:
        resp = await self._request("POST", f"{url}/session", json=task)
      except (httpx.TransportError, _Retryable) as e:   # unreachable, 5xx, or full (429)
        self._dead_until[url] = time.monotonic() + self.dead_cooldown_s
        errors.append(f"{url}: {e}")
        continue
      if resp.status_code >= 400:
        raise ValueError(f"executor refused a session for {task.get('instance_id')!r}: "
                         f"HTTP {resp.status_code}: {resp.text[:500]}")
      return AgentSession(self, url, resp.json(), task)
    raise SandboxError(f"no executor could open a session: {'; '.join(errors)[:1000]}")


class SessionLost(SandboxError):
  """The session is gone (ended, reaped, its executor restarted or unreachable). Its files lived
  on that one executor, so there is no failover: start a new session."""


class SessionToolError(ValueError):
  """A command or tool call the executor refused (bad path, edit not unique, bad timeout...): the
  message is meant for the agent, as the tool's result."""


class AgentSession:
  """One live session, pinned to the executor that holds it. Only requests that never reached the
  executor (connect errors) or were refused for load (429) are retried: a command may have run."""

  def __init__(self, client: SandboxClient, url: str, info: dict, task: dict):
    self.client, self.url, self.info, self.task = client, url, info, task
    self.id = info["id"]
    self._open = True
    client._load[url] += 1

  def _retrying(self):
    return tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type((httpx.ConnectError, httpx.ConnectTimeout,
                                                _Retryable)),
        wait=tenacity.wait_exponential_jitter(initial=0.2, max=5.0),
        stop=tenacity.stop_after_attempt(self.client.retry_attempts), reraise=True)

  async def _call(self, method: str, path: str, timeout_s: float = 120.0, **kw) -> dict:
    url = f"{self.url}/session/{self.id}{path}"
    try:
      async for attempt in self._retrying():
        with attempt:
          resp = await self.client._http.request(method, url, timeout=timeout_s, **kw)
          if resp.status_code == 429:
            raise _Retryable(f"{method} {url}: HTTP 429: {resp.text[:200]}")
    except (httpx.TransportError, _Retryable) as e:
      raise SessionLost(f"session {self.id} on {self.url}: the executor did not answer "
                        f"({type(e).__name__}: {e}); the session is lost") from e
    if resp.status_code in (404, 410):
      raise SessionLost(f"session {self.id} on {self.url}: {_message(resp)}")
    if resp.status_code >= 500:
      raise SessionLost(f"session {self.id} on {self.url}: executor error HTTP "
                        f"{resp.status_code}: {_message(resp)}")
    if resp.status_code >= 400:
      raise SessionToolError(_message(resp))
    return resp.json()

  async def exec(self, command: str, timeout_s: float | None = None) -> dict:
    """{"exit_code" (None on timeout), "timed_out", "stdout", "stderr", "*_truncated", ...}."""
    body = {"command": command} if timeout_s is None else {"command": command, "timeout": timeout_s}
    wait = (timeout_s or self.info.get("max_timeout_s", 600.0)) + 30.0
    return await self._call("POST", "/exec", timeout_s=wait, json=body)

  async def tool(self, name: str, **args) -> dict:
    """view(path, start, end) | edit(path, old_str, new_str) | create(path, content, overwrite)
    | search(pattern, path, regex, ignore_case, max_results) -> {"output", ...}."""
    return await self._call("POST", f"/tools/{name}", json=args)

  async def diff(self) -> str:
    return (await self._call("POST", "/diff"))["patch"]

  async def submit(self) -> dict:
    """Grades the working tree's diff in a fresh checkout and returns the verdict (the shape of
    `SandboxClient.run`; for a terminal task, its checker's verdict, answered at once). The
    session ends. Once the executor has the diff, the verdict is not
    lost: if that executor goes away while grading, the same diff is graded on another one."""
    try:
      record = await self._call("POST", "/submit", json={"wait": 0})
    except SessionLost:   # the answer was lost: a submitted session's 410 names its task
      try:
        gone = await self.client._http.get(f"{self.url}/session/{self.id}")
      except httpx.TransportError:
        raise SessionLost(f"session {self.id}: its executor {self.url} went away during the "
                          "submit; the session and its diff are lost") from None
      found = re.search(r"its verdict is task ([0-9a-f]+)", gone.text)
      if gone.status_code != 410 or not found:
        raise
      record = {"id": found.group(1), "status": "queued", "patch": None}
    finally:
      self._release()
    patch, task_id = record["patch"], record["id"]
    deadline = time.monotonic() + self.client.request_timeout_s
    while record["status"] != "done":
      left = deadline - time.monotonic()
      if left <= 0:
        raise SandboxError(f"session {self.id}: no verdict within {self.client.request_timeout_s} s")
      try:
        resp = await self.client._request("GET", f"{self.url}/task/{task_id}",
                                          params={"wait": min(self.client.wait_s, max(left, 0.1))})
      except (httpx.TransportError, _Retryable):
        resp = None
      if (resp is None or resp.status_code == 404) and patch is not None:
        # the executor is gone, the diff is here: grade it elsewhere
        self.client.resubmissions += 1
        return await self.client.run(dict(self.task, patch=patch))
      if resp is None or resp.status_code == 404:
        raise SandboxError(f"session {self.id}: its executor went away while grading")
      resp.raise_for_status()
      record = resp.json()
    return record["verdict"]

  async def close(self) -> None:
    """Ends the session (DELETE); one already gone is not an error."""
    try:
      await self._call("DELETE", "")
    except SessionLost:
      pass
    finally:
      self._release()

  def _release(self) -> None:
    if self._open:   # an open session counts as load on its executor (see SandboxClient._pick)
      self._open = False
      self.client._load[self.url] -= 1

  async def __aenter__(self):
    return self

  async def __aexit__(self, *exc):
    await self.close()


def _message(resp: httpx.Response) -> str:
  try:
    return str(resp.json().get("error", resp.text))[:1000]
  except ValueError:
    return resp.text[:1000]

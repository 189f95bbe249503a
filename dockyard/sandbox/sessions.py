"""Agent sessions: a live checkout of a task's base commit in the sandbox, for multi-turn agents.

  manager = SessionManager(executor, SessionLimits(idle_s=600))
  sid = (await manager.create(task))["id"]
  await manager.exec(sid, "python -m pytest -q tests", timeout_s=30)
  await manager.tool(sid, "edit", {"path": "calc/core.py", "old_str": "a - b", "new_str": "a + b"})
  patch = await manager.diff(sid)          # the server then grades it in a fresh checkout

A session is one `isolation.View` held open: the cached (repo, base_commit) tree as the lower
layer of an overlay whose upper layer lives on the session's size-limited tmpfs, in the holder's
private mount namespace. The held-out tests (the test_patch) and the history past base are not in
it: the tree is the cache's single-commit export, and the task's test fields stay on the host.
A terminal task (`task.TerminalTask`) gets the same view over a tree built from its file spec
(`cache.spec_tree`), its setup script run there first; instead of a diff it has `check`: its
checker, run after the episode in a fresh sandbox over the directory the agent left.

Each command is a FRESH bubblewrap run over that view (the same argv, limits and namespaces as a
grading run; no network), not a persistent sandbox with commands entered into it. Chosen because
it is simpler and keeps the guarantees the grading runs already test: the files persist (they are
the overlay's upper layer), but no process outlives its command (the command's pid namespace dies
with it, setsid daemons included), the wall-clock kill is the tested one, and there is no
in-sandbox agent to protect or trust. The price: `cd`, shell variables and background jobs do not
carry from one command to the next (the agent chains with `&&`), and each command pays a bwrap
start (bench/agent_sessions.py measures it). Commands of one session run one at a time.

File tools (view, edit, create, search) run in the same way, as `_session/dockyard_tools.py`
inside the sandbox, so a path check that failed would still leave the agent inside its own
sandbox. The diff is computed in the sandbox too, with a pristine read-only copy of the base
repository's .git (a hostile .git/config in the checkout runs nothing and hides nothing); the
diff is the agent's output and is graded as an untrusted patch, never inside the session.

Sessions end by DELETE, by submit, or by the reaper (idle past `idle_s`, alive past
`lifetime_s`); ending one kills its running command and drops its holder, hence its mounts. A
request naming an ended session gets 410 with the reason; one naming a session of an earlier run
of this executor (ids carry the run's boot id) gets 410 saying the executor restarted.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import re
import secrets
import signal
import time
from typing import Any

from dockyard.sandbox import isolation
from dockyard.sandbox.isolation import WORKDIR, Output, View, pipe_with
from dockyard.sandbox.cache import spec_tree
from dockyard.sandbox.environments import EnvironmentBuildError
from dockyard.sandbox.task import TaskError, TerminalTask, is_terminal, parse_task, parse_terminal_task

TOOLS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_session")
TOOLS_MOUNT = "/dockyard/tools"
BASE_GIT_MOUNT = "/dockyard/base.git"
TOOLS = ("view", "edit", "create", "search")
_ID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{24}$")   # boot id - session token
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*",
            "GIT_TERMINAL_PROMPT": "0"}
# The diff against base, through a pristine git dir: index and new objects on the run's /tmp.
_DIFF = r"""
set -e
export GIT_DIR=/dockyard/base.git GIT_WORK_TREE=/testbed GIT_INDEX_FILE=/tmp/.dy-index
export GIT_OBJECT_DIRECTORY=/tmp/.dy-objects GIT_ALTERNATE_OBJECT_DIRECTORIES=/dockyard/base.git/objects
mkdir -p "$GIT_OBJECT_DIRECTORY"
git read-tree HEAD
git add -A
exec git diff --cached --no-color --no-ext-diff --no-textconv HEAD
"""


@dataclasses.dataclass
class SessionLimits:
  """Session limits; the per-command limits are the executor's `Limits` (timeout_s is the most a
  command may ask for and its default)."""
  max_sessions: int = 64              # live sessions per executor; more get 429
  idle_s: float = 600.0               # reaped when no request came for this long
  lifetime_s: float = 3600.0          # reaped this long after creation, busy or not
  max_command_bytes: int = 64 << 10   # a longer command is refused (413)
  max_output_bytes: int = 64 << 10    # kept per stream (stdout, stderr): head and tail halves
  max_patch_bytes: int = 8 << 20      # a larger diff cannot be submitted (413)
  keep_ended: int = 10000             # ended ids remembered, to answer 410 with the reason

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"SessionLimits.{field.name}: expected a positive number, got {value!r}")


class SessionError(Exception):
  """A request that cannot be served; `status` is its HTTP status (4xx)."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


@dataclasses.dataclass
class _Session:
  id: str
  task: dict                      # the task record, test fields included: host side only
  instance_id: str
  view: View
  created: float
  last_used: float
  lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
  dead: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
  commands: int = 0
  terminal: TerminalTask | None = None   # a terminal task: checked (`check`), not diffed


@dataclasses.dataclass
class _Run:
  exit_code: int | None
  timed_out: bool
  killed: bool
  wall_s: float
  stdout: Output
  stderr: Output


class SessionManager:

  def __init__(self, executor, limits: SessionLimits | None = None):
    self.executor = executor
    self.limits = limits or SessionLimits()
    self.boot = secrets.token_hex(4)   # ids name the executor run that made them
    self.sessions: dict[str, _Session] = {}
    self.ended: collections.OrderedDict[str, str] = collections.OrderedDict()
    self.counters = collections.Counter()
    self._pending = 0

  # --- lifecycle -------------------------------------------------------------------------------

  async def create(self, body: Any) -> dict:
    """A new session for a task record (or {"task": record}); the agent's patch field is not
    needed. Raises SessionError 422 for a bad task, 429 when `max_sessions` are live."""
    task = body.get("task", body) if isinstance(body, dict) else body
    if not isinstance(task, dict):
      raise SessionError(422, "body: expected a task record (or {'task': record})")
    terminal = None
    try:
      if is_terminal(task):
        terminal = parse_terminal_task(task)
        instance_id = terminal.instance_id
      else:
        task = {**task, "patch": task.get("patch", "")}
        parsed = parse_task(task)
        instance_id = parsed.instance_id
    except TaskError as e:
      raise SessionError(422, str(e)) from None
    if len(self.sessions) + self._pending >= self.limits.max_sessions:
      self.counters["sessions_rejected_total"] += 1
      raise SessionError(429, f"session limit reached ({self.limits.max_sessions} live); "
                              "end one or retry later")
    self._pending += 1
    try:
      interpreter = None
      if terminal is not None:   # the starting directory: files from the spec, then its setup
        lower = await asyncio.to_thread(spec_tree, self.executor.cache.cache_dir, terminal.files,
                                        isolation.SANDBOX_UID)
        binds = [(TOOLS_DIR, TOOLS_MOUNT)]
      else:
        try:
          lower = await self.executor.cache.tree(parsed.repo, parsed.base_commit)
        except Exception as e:   # RepoError: the task names what this executor does not hold
          raise SessionError(422, f"repo: {e}") from None
        binds = [(TOOLS_DIR, TOOLS_MOUNT), (os.path.join(lower, ".git"), BASE_GIT_MOUNT)]
        if parsed.environment is not None:   # the agent's commands see the task's Python
          try:
            interpreter = await self.executor.envs.ensure(parsed.environment)
          except EnvironmentBuildError as e:
            raise SessionError(422, f"environment: {e}") from None
      view = View(lower, self.executor.limits, binds=binds, interpreter=interpreter)
      await view.__aenter__()
      if terminal is not None and terminal.setup.strip():
        try:
          setup = await _exec(view, ["bash", "-c", terminal.setup], {},
                              self.executor.limits.timeout_s, b"", asyncio.Event(),
                              self.limits.max_output_bytes)
        except BaseException:
          await view.close()
          raise
        if setup.exit_code != 0:
          await view.close()
          raise SessionError(422, f"setup: failed (exit {setup.exit_code}, timed out "
                                  f"{setup.timed_out}): {setup.stderr.text()[-500:]}")
    finally:
      self._pending -= 1
    sid = f"{self.boot}-{secrets.token_hex(12)}"
    now = time.monotonic()
    self.sessions[sid] = _Session(sid, task, instance_id, view, now, now, terminal=terminal)
    self.counters["sessions_created_total"] += 1
    return {"id": sid, "instance_id": instance_id, "workdir": WORKDIR,
            "idle_s": self.limits.idle_s, "lifetime_s": self.limits.lifetime_s,
            "max_timeout_s": self.executor.limits.timeout_s}

  def get(self, sid: str) -> _Session:
    s = self.sessions.get(sid)
    if s is not None:
      return s
    if sid in self.ended:
      raise SessionError(410, f"session {sid!r} is gone: {self.ended[sid]}")
    if _ID_RE.match(sid) and not sid.startswith(self.boot + "-"):
      raise SessionError(410, f"session {sid!r} is gone: the executor restarted since it was "
                              "created (sessions do not survive a restart); start a new one")
    raise SessionError(404, f"session {sid!r}: unknown (never created on this executor)")

  async def close(self, sid: str, reason: str) -> None:
    """Ends a session: its running command is killed, its view (mounts, files) dropped."""
    s = self.sessions.pop(sid, None)
    if s is None:
      self.get(sid)   # raises 404 / 410
      return
    self.ended[sid] = reason
    while len(self.ended) > self.limits.keep_ended:
      self.ended.popitem(last=False)
    s.dead.set()
    async with s.lock:   # the running command sees `dead`, kills its tree and releases the lock
      await s.view.close()
    self.counters["sessions_ended_total"] += 1

  async def reap(self, now: float | None = None) -> list[str]:
    """Ends idle and overdue sessions; returns their ids."""
    now = time.monotonic() if now is None else now
    gone = []
    for sid, s in list(self.sessions.items()):
      if now - s.created > self.limits.lifetime_s:
        reason = f"reaped: alive past the session lifetime ({self.limits.lifetime_s:g} s)"
      elif now - s.last_used > self.limits.idle_s and not s.lock.locked():
        reason = f"reaped: idle past {self.limits.idle_s:g} s"
      else:
        continue
      await self.close(sid, reason)
      self.counters["sessions_reaped_total"] += 1
      gone.append(sid)
    return gone

  async def reap_forever(self) -> None:
    interval = max(0.2, min(5.0, self.limits.idle_s / 4, self.limits.lifetime_s / 4))
    while True:
      await asyncio.sleep(interval)
      try:
        await self.reap()
      except Exception:   # one failed close must not stop the reaper
        self.counters["reaper_errors_total"] += 1

  async def close_all(self, reason: str = "the executor shut down") -> None:
    for sid in list(self.sessions):
      await self.close(sid, reason)

  # --- work in a session -----------------------------------------------------------------------

  def check_timeout(self, timeout: Any) -> float:
    most = self.executor.limits.timeout_s
    if timeout is None:
      return most
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= most:
      raise SessionError(422, f"timeout: expected seconds in (0, {most:g}], got {timeout!r}")
    return float(timeout)

  async def exec(self, sid: str, command: Any, timeout_s: Any = None) -> dict:
    """Runs `command` with bash in the session's sandbox, cwd /testbed."""
    if not isinstance(command, str) or not command.strip():
      raise SessionError(422, "command: expected a non-empty string")
    if "\0" in command:
      raise SessionError(422, "command: contains a NUL byte")
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > self.limits.max_command_bytes:
      raise SessionError(413, f"command: {size} bytes, more than the "
                              f"{self.limits.max_command_bytes} allowed")
    timeout = self.check_timeout(timeout_s)
    s = self.get(sid)
    run = await self._run(s, ["bash", "-c", command], timeout)
    self.counters["session_execs_total"] += 1
    return {"exit_code": run.exit_code, "timed_out": run.timed_out, "wall_s": round(run.wall_s, 4),
            "stdout": run.stdout.text(), "stderr": run.stderr.text(),
            "stdout_truncated": run.stdout.truncated, "stderr_truncated": run.stderr.truncated,
            "stdout_bytes": run.stdout.total_bytes, "stderr_bytes": run.stderr.total_bytes}

  async def tool(self, sid: str, name: str, args: Any) -> dict:
    """A file tool; raises SessionError 422 with the tool's message on a bad path or edit."""
    if name not in TOOLS:
      raise SessionError(404, f"tool {name!r}: unknown (one of {list(TOOLS)})")
    if not isinstance(args, dict):
      raise SessionError(422, "body: expected a JSON object of the tool's arguments")
    s = self.get(sid)
    request = json.dumps({"tool": name, "args": args}).encode()
    run = await self._run(s, [s.view.interpreter.executable, "-P", "-s", "-B", f"{TOOLS_MOUNT}/dockyard_tools.py"],
                          self.executor.limits.timeout_s, stdin=request, output_bytes=4 << 20)
    self.counters[f"session_tool_{name}_total"] += 1
    try:
      answer = json.loads(run.stdout.head + run.stdout.tail)
    except ValueError:
      raise SessionError(500 if not run.timed_out else 504,
                         f"tool {name!r}: no answer (exit {run.exit_code}, timed out "
                         f"{run.timed_out}): {run.stderr.text()[-500:]}") from None
    if not answer.pop("ok", False):
      raise SessionError(422, f"{name}: {answer.get('error')}")
    return answer

  async def diff(self, sid: str) -> str:
    """The working tree's diff against the base commit (new files included, .gitignore kept)."""
    s = self.get(sid)
    if s.terminal is not None:
      raise SessionError(422, "diff: a terminal task has no base to diff against; submit runs its "
                              "checker")
    limit = self.limits.max_patch_bytes
    run = await self._run(s, ["sh", "-c", _DIFF], self.executor.limits.timeout_s, env=_GIT_ENV,
                          output_bytes=2 * limit + 2)
    if run.exit_code != 0:
      raise SessionError(500, f"diff: git failed (exit {run.exit_code}, timed out "
                              f"{run.timed_out}): {run.stderr.text()[-800:]}")
    if run.stdout.total_bytes > limit:
      raise SessionError(413, f"diff: {run.stdout.total_bytes} bytes, more than the {limit} a "
                              "submission may carry")
    return (run.stdout.head + run.stdout.tail).decode("utf-8", "replace")

  async def check(self, sid: str) -> dict:
    """A terminal task's verdict: its checker (from the host-side record, never in the agent's
    tree) runs in a fresh sandbox over the directory as the agent left it; none of the agent's
    processes is alive by then (each died with its command). Exit status 0 passes: reward 1."""
    s = self.get(sid)
    if s.terminal is None:
      raise SessionError(422, "check: only a terminal task has a checker; submit grades the diff")
    run = await self._run(s, ["bash", "-c", s.terminal.check], self.executor.limits.timeout_s)
    self.counters["session_checks_total"] += 1
    passed = run.exit_code == 0
    return {"instance_id": s.instance_id, "kind": "terminal", "passed": passed,
            "reward": 1.0 if passed else 0.0, "exit_code": run.exit_code,
            "timed_out": run.timed_out, "stdout": run.stdout.text()[-2000:],
            "stderr": run.stderr.text()[-2000:]}

  def info(self, sid: str) -> dict:
    s = self.get(sid)
    now = time.monotonic()
    return {"id": sid, "instance_id": s.instance_id, "age_s": round(now - s.created, 3),
            "idle_s": round(now - s.last_used, 3), "commands": s.commands, "busy": s.lock.locked()}

  async def _run(self, s: _Session, argv: list[str], timeout_s: float, stdin: bytes = b"",
                 env: dict | None = None, output_bytes: int | None = None) -> _Run:
    async with s.lock:
      if s.dead.is_set():
        self.get(s.id)  # raises 410 with the reason
      s.last_used = time.monotonic()
      s.commands += 1
      try:
        run = await _exec(s.view, argv, env or {}, timeout_s, stdin, s.dead,
                          output_bytes or self.limits.max_output_bytes)
      finally:
        s.last_used = time.monotonic()
    if run.killed:
      raise SessionError(410, f"session {s.id!r} is gone: {self.ended.get(s.id, 'ended')} "
                              "(its running command was killed)")
    return run


async def _exec(view: View, argv: list[str], env: dict, timeout_s: float, stdin: bytes,
                dead: asyncio.Event, max_output: int) -> _Run:
  """`View.exec` with stdout and stderr apart, stdin data, and a kill when the session ends.

  Same bwrap argv (options on a consumed pipe), same tree kill: bwrap's --info-fd names the
  sandbox's pid 1, which is SIGKILLed and waited for, so nothing of the command is alive after.
  """
  info_r, info_w = os.pipe()
  full = view.bwrap_argv(argv, env, info_fd=info_w)
  at, end = full.index("bwrap") + 1, full.index("prlimit")
  args_r = pipe_with(b"".join(a.encode() + b"\0" for a in full[at:end]))
  stdin_r = pipe_with(stdin)
  # As View.exec: nsenter enters the view's mount namespace and drops to the sandbox uid and gid
  # with no supplementary groups; bwrap then runs unprivileged.
  cmd = (["nsenter", f"--mount=/proc/{view._holder.pid}/ns/mnt",
          f"--setuid={isolation.SANDBOX_UID}", f"--setgid={isolation.SANDBOX_UID}", "--"]
         + full[:at] + ["--args", str(args_r)] + full[end:])
  start = time.monotonic()
  try:
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdin=stdin_r, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        pass_fds=(info_w, args_r), start_new_session=True)
  finally:
    for fd in (info_w, args_r, stdin_r):
      os.close(fd)
  outs = [asyncio.ensure_future(isolation._drain(p, max_output)) for p in (proc.stdout, proc.stderr)]
  info = asyncio.ensure_future(isolation._read_small(info_r))
  waiter, killer = asyncio.ensure_future(proc.wait()), asyncio.ensure_future(dead.wait())
  try:
    await asyncio.wait([waiter, killer], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
  finally:
    killed = killer.done() and not waiter.done()
    timed_out = not waiter.done() and not killed
    killer.cancel()
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    await proc.wait()
    try:
      child = isolation._child_pid(await asyncio.wait_for(info, 5))
    except asyncio.TimeoutError:
      child = None
    if child:
      await isolation._kill_and_wait(child)
      isolation._remember_if_alive(child)
  results = []
  for fut in outs:
    try:
      results.append(await asyncio.wait_for(fut, 10))
    except asyncio.TimeoutError:
      results.append(Output(b"", b"[output pipe held open past the run; dropped]", 0))
  return _Run(None if (timed_out or killed) else proc.returncode, timed_out, killed,
              time.monotonic() - start, results[0], results[1])

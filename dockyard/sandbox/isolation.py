"""Isolation: a private copy-on-write view of a cached tree, and bubblewrap runs inside it.

A `View` is one task's workspace. A small root "holder" process lives in its own mount namespace
(`unshare --mount`) where it mounts a size-limited tmpfs (the run's disk budget) at MOUNT_POINT
and an overlayfs on it: the cached tree is the read-only lower layer, the tmpfs holds the upper
layer, so a run sees a private writable copy and the cache is never written (no hardlinks). Host
paths the sandbox needs but the sandbox user may not traverse (the run's Python: the executor's or a
task environment's venv, e.g. under /root) are bound
into the tmpfs by root. Every command then enters that namespace and drops to an unprivileged
uid and no supplementary groups in one step (`nsenter --setuid --setgid`), and runs under `bwrap --unshare-all` (new user, pid, net, ipc, uts
namespaces: no network; read-only system; tmpfs /tmp and $HOME; only /testbed writable), with
rlimits set by `prlimit`. RLIMIT_NPROC bites because the outer uid is not root. When the holder
exits, its namespace and every mount in it disappear; killing bwrap kills the sandbox's pid 1,
which takes the whole process tree (setsid daemons included) down with the pid namespace.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import signal
import tempfile
import threading
import time
from typing import Sequence

from dockyard.sandbox.environments import Interpreter, host_interpreter

MOUNT_POINT = os.path.join(tempfile.gettempdir(), "dockyard-sandbox-mnt")
SANDBOX_UID = 65534           # nobody: not root, so RLIMIT_NPROC applies
WORKDIR = "/testbed"          # where the view appears inside the sandbox
INPUT_DIR = "/dockyard/in"    # read-only inputs (patches) inside the sandbox
HOME = "/home/sandbox"
MAX_SNAPSHOT_ENTRIES = 100_000   # files a run may leave in its tree before the walk stops
OVERFLOW_KEY = "\0overflow"       # no real path holds a NUL


@dataclasses.dataclass
class Limits:
  """Per-run limits; the names match `config.sandbox`."""
  timeout_s: float = 60.0          # wall clock for one command; the whole tree is killed
  cpu_time_s: int = 120            # RLIMIT_CPU per process
  memory_mb: int = 4096            # RLIMIT_AS per process
  max_processes: int = 256         # RLIMIT_NPROC for the sandbox user
  max_file_size_mb: int = 64       # RLIMIT_FSIZE
  max_open_files: int = 1024       # RLIMIT_NOFILE
  max_output_bytes: int = 1 << 20  # stdout+stderr kept (head and tail halves)
  disk_mb: int = 1024              # the view's tmpfs (writes into the tree) and /tmp each

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"Limits.{field.name}: expected a positive number, got {value!r}")

  @classmethod
  def from_config(cls, sandbox_config) -> "Limits":
    names = [f.name for f in dataclasses.fields(cls)]
    return cls(**{n: sandbox_config[n] for n in names if n in sandbox_config})


@dataclasses.dataclass
class Output:
  """Head and tail of a stream whose total size may be huge."""
  head: bytes = b""
  tail: bytes = b""
  total_bytes: int = 0

  @property
  def truncated(self) -> bool:
    return self.total_bytes > len(self.head) + len(self.tail)

  def text(self) -> str:
    gap = f"\n... [{self.total_bytes - len(self.head) - len(self.tail)} bytes cut] ...\n"
    return self.head.decode(errors="replace") + (gap if self.truncated else "") + (
        self.tail.decode(errors="replace"))


@dataclasses.dataclass
class RunResult:
  exit_code: int | None          # None when killed for the wall clock
  timed_out: bool
  wall_s: float
  output: Output


async def _drain(reader: asyncio.StreamReader, limit: int) -> Output:
  """Reads to EOF keeping the first and last `limit // 2` bytes (memory stays bounded)."""
  half = max(limit // 2, 1)
  head = bytearray()
  tail: collections.deque[bytes] = collections.deque()
  tail_len = total = 0
  while chunk := await reader.read(65536):
    total += len(chunk)
    if len(head) < half:
      take = half - len(head)
      head += chunk[:take]
      chunk = chunk[take:]
    if chunk:
      tail.append(chunk)
      tail_len += len(chunk)
      while tail_len - len(tail[0]) >= half:
        tail_len -= len(tail.popleft())
  tail_bytes = b"".join(tail)[-half:] if tail else b""
  return Output(bytes(head), tail_bytes, total)


def _system_binds() -> list[str]:
  """bwrap arguments for a read-only system: /usr, /etc and the usr-merge symlinks."""
  args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
  for name in ("bin", "sbin", "lib", "lib32", "lib64"):
    path = "/" + name
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  return args


def check_host() -> None:
  """Fails with a clear message when this machine cannot run the sandbox."""
  if os.geteuid() != 0:
    raise RuntimeError("the sandbox executor must run as root: it mounts a tmpfs and an overlayfs "
                       "in a private mount namespace and drops to uid 65534 for each run")
  for tool in ("bwrap", "unshare", "nsenter", "prlimit", "git", "patch"):
    if not any(os.access(os.path.join(d, tool), os.X_OK) for d in os.environ.get(
        "PATH", "/usr/bin:/bin").split(":") + ["/usr/bin"]):
      raise RuntimeError(f"the sandbox needs {tool!r} on PATH (bwrap: apt-get install bubblewrap)")


_HOLDER = r"""
set -eu
M=$1; LOWER=$2; SIZE=$3; U=$4; shift 4
mount -t tmpfs -o size=${SIZE}m,nr_inodes=262144,mode=0755 dockyard-run "$M"
mkdir "$M/up" "$M/wk" "$M/work" "$M/in" "$M/b"
chown "$U:$U" "$M/up"
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$M/up,workdir=$M/wk" "$M/work"
i=0; d=""
for p in "$@"; do d="$d $M/b/$i"; i=$((i+1)); done
[ -z "$d" ] || mkdir $d
i=0
for p in "$@"; do mount --rbind "$p" "$M/b/$i"; i=$((i+1)); done
echo ready
exec cat >/dev/null
"""

_RESET = r"""
set -eu
M=$1; LOWER=$2; U=$3
umount -l "$M/work"
rm -rf "$M/up" "$M/wk"
mkdir "$M/up" "$M/wk"
chown "$U:$U" "$M/up"
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$M/up,workdir=$M/wk" "$M/work"
"""


class View:
  """One run's private copy-on-write tree (see the module docstring). Use `async with`."""

  def __init__(self, lower: str, limits: Limits, binds: Sequence[tuple[str, str]] = (),
               interpreter: Interpreter | None = None):
    """`binds`: extra (host dir, sandbox path) pairs mounted read-only. `interpreter`: the
    Python the runs use (its directories mounted read-only, its bin first on PATH); default: the
    executor's own. Nothing else of the host's Python is visible."""
    self.lower = lower
    self.limits = limits
    self.interpreter = interpreter or host_interpreter()
    self.binds = [(p, p) for p in self.interpreter.binds] + list(binds)
    self._holder: asyncio.subprocess.Process | None = None

  async def __aenter__(self) -> "View":
    if self._holder is None:
      await self.start()
    return self

  def alive(self) -> bool:
    return self._holder is not None and self._holder.returncode is None

  async def start(self) -> "View":
    """Sets the view up (`async with` does it too, unless it was started already)."""
    os.makedirs(MOUNT_POINT, exist_ok=True)
    os.chmod(MOUNT_POINT, 0o755)
    self._holder = await asyncio.create_subprocess_exec(
        "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _HOLDER, "holder",
        MOUNT_POINT, self.lower, str(self.limits.disk_mb), str(SANDBOX_UID), *[host for host, _ in self.binds],
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True)
    line = await asyncio.wait_for(self._holder.stdout.readline(), 30)
    if line.strip() != b"ready":
      err = await self._holder.stderr.read()
      await self.close()
      raise RuntimeError(f"could not set up the run's overlay view: {err.decode()[-800:]}")
    return self

  async def __aexit__(self, *exc) -> None:
    await self.close()

  async def close(self) -> None:
    holder, self._holder = self._holder, None
    if holder is None:
      return
    if holder.returncode is None:
      try:
        os.killpg(holder.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    await holder.wait()

  def host_path(self, *parts: str) -> str:
    """A path inside the view's mount namespace, reachable from the host as root."""
    return os.path.join(f"/proc/{self._holder.pid}/root{MOUNT_POINT}", *parts)

  def _nsenter(self) -> list[str]:
    return ["nsenter", f"--mount=/proc/{self._holder.pid}/ns/mnt", "--"]

  async def reset(self) -> None:
    """Drops every change: a fresh, empty upper layer over the cached tree."""
    proc = await asyncio.create_subprocess_exec(
        *self._nsenter(), "sh", "-c", _RESET, "reset", MOUNT_POINT, self.lower, str(SANDBOX_UID),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode:
      raise RuntimeError(f"could not reset the run's view: {err.decode()[-500:]}")

  def write_input(self, name: str, data: str) -> str:
    """Writes a read-only input (e.g. a patch) the sandbox sees under INPUT_DIR."""
    with open(self.host_path("in", name), "w") as f:
      f.write(data)
    return f"{INPUT_DIR}/{name}"

  def snapshot_upper(self, max_entries: int = MAX_SNAPSHOT_ENTRIES) -> dict[str, tuple]:
    """What runs have written so far (see `walk_tree`). It blocks on the file system: call it
    in a thread (`asyncio.to_thread`), never on the event loop (200k files stalled /healthz)."""
    return walk_tree(self.host_path("up"), max_entries)

  def bwrap_argv(self, argv: Sequence[str], env: dict[str, str], ro_files: Sequence[str] = (),
                 cwd: str = WORKDIR, info_fd: int | None = None,
                 masks: Sequence[str] = ()) -> list[str]:
    """`masks`: directories under WORKDIR hidden behind an empty read-only tmpfs."""
    lim = self.limits
    m = MOUNT_POINT
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            *_system_binds(), "--proc", "/proc", "--dev", "/dev",
            "--size", str(lim.disk_mb << 20), "--tmpfs", "/tmp",
            "--size", str(64 << 20), "--tmpfs", HOME,
            "--bind", f"{m}/work", WORKDIR, "--ro-bind", f"{m}/in", INPUT_DIR]
    for i, (_, path) in enumerate(self.binds):
      args += ["--ro-bind", f"{m}/b/{i}", path]
    for rel in ro_files:
      args += ["--ro-bind", f"{m}/work/{rel}", f"{WORKDIR}/{rel}"]
    for rel in masks:
      args += ["--size", "4096", "--tmpfs", f"{WORKDIR}/{rel}", "--remount-ro", f"{WORKDIR}/{rel}"]
    base_env = {"HOME": HOME, "TMPDIR": "/tmp", "TZ": "UTC", "PYTHONHASHSEED": "0",
                "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
                "PATH": f"{self.interpreter.bin_dir}:/usr/local/bin:/usr/bin:/bin"}
    for key, value in {**base_env, **env}.items():
      args += ["--setenv", key, value]
    if info_fd is not None:
      args += ["--info-fd", str(info_fd)]
    args += ["--remount-ro", "/", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
             "--hostname", "sandbox", "--chdir", cwd,
             "prlimit", f"--cpu={lim.cpu_time_s}:{lim.cpu_time_s + 1}",
             f"--as={lim.memory_mb << 20}", f"--nproc={lim.max_processes}",
             f"--fsize={lim.max_file_size_mb << 20}", f"--nofile={lim.max_open_files}",
             "--core=0", "--", *argv]
    return args

  async def exec(self, argv: Sequence[str], env: dict[str, str] | None = None,
                 ro_files: Sequence[str] = (), pass_fds: Sequence[int] = (),
                 timeout_s: float | None = None, masks: Sequence[str] = ()) -> RunResult:
    """Runs argv in the sandbox over this view; kills the whole tree at the wall-clock limit.

    bwrap's --info-fd tells us the host pid of the sandbox's pid 1; it is killed (which empties
    the pid namespace) and waited for, so nothing of the run is alive when this returns.
    """
    info_r, info_w = os.pipe()
    full = self.bwrap_argv(argv, env or {}, ro_files, info_fd=info_w, masks=masks)
    # bwrap reads its options (binds with host paths, env) from a pipe it consumes, so the
    # sandbox's /proc/1/cmdline shows `bwrap --args N prlimit ... <command>`, no host paths.
    at, end = full.index("bwrap") + 1, full.index("prlimit")
    args_r = pipe_with(b"".join(a.encode() + b"\0" for a in full[at:end]))
    # nsenter enters the view's mount namespace and, as it goes, drops to the sandbox uid and gid
    # with no supplementary groups (one exec fewer than a separate setpriv).
    cmd = (["nsenter", f"--mount=/proc/{self._holder.pid}/ns/mnt", f"--setuid={SANDBOX_UID}",
            f"--setgid={SANDBOX_UID}", "--"] + full[:at] + ["--args", str(args_r)] + full[end:])
    start = time.monotonic()
    try:
      proc = await asyncio.create_subprocess_exec(
          *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
          stderr=asyncio.subprocess.STDOUT, pass_fds=(info_w, args_r, *pass_fds),
          start_new_session=True)
    finally:
      os.close(info_w)
      os.close(args_r)
    drain = asyncio.ensure_future(_drain(proc.stdout, self.limits.max_output_bytes))
    info = asyncio.ensure_future(_read_small(info_r))
    timed_out = False
    try:
      await asyncio.wait_for(proc.wait(), timeout_s or self.limits.timeout_s)
    except asyncio.TimeoutError:
      timed_out = True
    finally:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      await proc.wait()
      child = _child_pid(await asyncio.wait_for(info, 5))
      if child:
        await _kill_and_wait(child)
        _remember_if_alive(child)
    try:
      output = await asyncio.wait_for(drain, 10)
    except asyncio.TimeoutError:
      output = Output(b"", b"[output pipe held open past the run; dropped]", 0)
    return RunResult(None if timed_out else proc.returncode, timed_out,
                     time.monotonic() - start, output)


def walk_tree(root: str, max_entries: int = MAX_SNAPSHOT_ENTRIES) -> dict[str, tuple]:
  """{relative path: (kind, size, mtime_ns)} of everything under root, symlinks not followed.

  An explicit stack, not os.walk (recursive in Python 3.11: a 1,500-deep tree raised
  RecursionError), and at most `max_entries` entries; past that the result holds OVERFLOW_KEY.
  """
  out: dict[str, tuple] = {}
  stack = [""]
  while stack:
    rel = stack.pop()
    try:
      with os.scandir(os.path.join(root, rel) if rel else root) as it:
        entries = list(it)
    except OSError:
      continue
    for entry in entries:
      if len(out) >= max_entries:
        out[OVERFLOW_KEY] = ("overflow", len(out), 0)
        return out
      path = f"{rel}/{entry.name}" if rel else entry.name
      try:
        st = entry.stat(follow_symlinks=False)
      except OSError:
        continue
      if entry.is_symlink():
        kind = "link"
      elif entry.is_dir(follow_symlinks=False):
        kind = "dir"
        stack.append(path)
      else:
        kind = "file"
      out[path] = (kind, st.st_size, st.st_mtime_ns)
  return out


def pipe_with(data: bytes) -> int:
  """A pipe's read end holding `data`; a writer thread feeds what the pipe buffer cannot hold.
  The reader consumes the data: no other holder of the fd can read it back later."""
  r, w = os.pipe()
  if len(data) <= 60000:
    os.write(w, data)
    os.close(w)
    return r

  def feed():
    try:
      view = memoryview(data)
      while view:
        view = view[os.write(w, view):]
    except OSError:
      pass  # the reader died: nothing left to deliver
    finally:
      os.close(w)
  threading.Thread(target=feed, daemon=True).start()
  return r


async def _read_small(fd: int) -> bytes:
  loop = asyncio.get_running_loop()
  reader = asyncio.StreamReader()
  transport, _ = await loop.connect_read_pipe(
      lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
  try:
    # To EOF: closing early would make bwrap's next write hit EPIPE and SIGPIPE kill it
    # mid-setup, leaving its child blocked forever.
    return await reader.read()
  finally:
    transport.close()


def _child_pid(info: bytes) -> int | None:
  try:
    return int(json.loads(info.decode().split("}")[0] + "}")["child-pid"])
  except (ValueError, KeyError, IndexError):
    return None


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (OSError, IndexError):
    return False


async def _kill_and_wait(pid: int, timeout_s: float = 5.0) -> None:
  """SIGKILLs the sandbox's pid 1 (the kernel then kills its namespace) and waits until dead."""
  deadline = time.monotonic() + timeout_s
  while _alive(pid) and time.monotonic() < deadline:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      return
    await asyncio.sleep(0.01)


# Sandboxes of this process whose pid 1 was still alive after the kill: (host pid, start time).
# Only these can hold leftover processes (when a pid namespace's pid 1 dies, the kernel kills
# everything in it), so only these are looked at; another executor's sandboxes never are.
_SURVIVORS: set[tuple[int, str]] = set()


def _start_time(pid: int) -> str | None:
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except (OSError, IndexError):
    return None
  return None if fields[0] == "Z" else fields[19]   # field 22 of stat: start time


def _remember_if_alive(pid: int) -> None:
  start = _start_time(pid)
  if start is not None:
    _SURVIVORS.add((pid, start))


def live_sandbox_processes() -> list[str]:
  """This process's sandbox processes still alive ("pid name"); none may outlive a run.

  A sandbox is tracked by its pid 1 (bwrap's init, whose host pid --info-fd reports): every
  process in the sandbox is that pid 1 or a descendant of it (orphans are reparented to it), and
  when it dies the kernel kills the rest. So the processes counted are the pid 1s of this
  process's runs that survived their kill, and their live descendants; zombies are dead and
  skipped. Concurrent sandboxes of other executors on the machine are never counted.
  """
  roots = set()
  for pid, start in list(_SURVIVORS):
    if _start_time(pid) == start:
      roots.add(pid)
    else:
      _SURVIVORS.discard((pid, start))   # dead (or the pid was reused)
  if not roots:
    return []
  children: dict[int, list[int]] = {}
  names: dict[int, str] = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/status") as f:
        fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    except OSError:
      continue
    if fields.get("State", "").split()[:1] == ["Z"]:
      continue
    names[int(entry)] = fields.get("Name", "").strip()
    children.setdefault(int(fields.get("PPid", "0").strip() or 0), []).append(int(entry))
  out, stack = [], [r for r in roots if r in names]
  while stack:
    pid = stack.pop()
    out.append(f"{pid} {names[pid]}")
    stack += [c for c in children.get(pid, []) if c in names]
  return sorted(out)

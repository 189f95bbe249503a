"""The executor: one task in, one verdict out (apply, restore, run, grade), `slots` at a time.

  verdict = await Executor(repos_dir=..., slots=2).run(task)

Steps: static integrity checks on the agent's patch; the cached tree for (repo, base_commit); a
private view (a spare one started during the previous run of the same tree, if any); the apply
cascade (`git apply`, `git apply --3way`, `patch --fuzz`, the view reset between tries);
held-out files forced back to base_commit and files the test_patch adds removed; the test_patch
applied; a randomly named canary test and poisoned twins of some FAIL_TO_PASS tests added (the
executor answers, per item and only after its body ran, which items are twins); pytest run under
bubblewrap through our launcher (trusted imports before any repo code, configuration on a pipe
it consumes) with our reporting plugin writing to a pipe; what the run wrote checked; grading.
A task with an `environment` runs in that venv (built once per spec, `environments.py`): only it
and its base interpreter are mounted, never the executor's own venv; a failed build is a verdict
with the finding `environment_error`, not a wrong patch.

The common case is ONE sandbox run: a patch with no finding that touches no config file needs
nothing restored and no config read between apply and tests, so the test_patch is applied on the
host (to copies from the cached tree, once per tree), the canary and twins are written, and the
sandbox applies the agent's patch with `git apply` and, in the same process, becomes pytest. If
it does not apply, the view is reset and the cascade goes on as above (apply, restore and test
runs). A patch that does not apply, a missing repo or a timeout is a verdict with a reason,
never an exception. Threat model: docs/sandbox-integrity.md.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import os
import posixpath
import secrets
import shlex
import shutil
import tempfile
import time
from typing import Any

from dockyard.sandbox import grading, integrity, twins
from dockyard.sandbox.cache import RepoCache, RepoError
from dockyard.sandbox.environments import (EnvironmentBuildError, EnvironmentCache, Interpreter,
                                           host_interpreter)
from dockyard.sandbox.isolation import (SANDBOX_UID, WORKDIR, Limits, Output, View,
                                        check_host, pipe_with)
from dockyard.sandbox.task import Task, parse_task

__all__ = ["Executor", "Limits"]

PLUGIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_plugin")
PLUGIN_MOUNT = "/dockyard/plugin"
LAUNCHER = "dockyard_launch.py"
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
APPLY_CASCADE = (
    ("git apply", ["git", "apply", "--verbose", "--whitespace=nowarn"]),
    # The cached index holds another tree's stat data: refresh it or --3way sees every file dirty.
    ("git apply --3way", ["sh", "-c", 'git update-index -q --refresh; exec git apply --verbose '
                          '--3way --whitespace=nowarn "$0"']),
    ("patch --fuzz", ["patch", "--batch", "--forward", "--fuzz=5", "-p1",
                      "--no-backup-if-mismatch", "-i"]),
)
_MAX_REPORT_BYTES = 32 << 20
_MAX_ASK_BYTES = 4 << 20
_APPLY_FAILED = 97                       # exit status of the combined run: the patch did not apply
_MAX_ASKS = 1_000_000


@dataclasses.dataclass
class Verdict:
  instance_id: str
  resolved: bool = False
  reward: float = 0.0
  pass_rate: float = 0.0
  tests_status: dict[str, str] = dataclasses.field(default_factory=dict)
  findings: list[str] = dataclasses.field(default_factory=list)
  patch_applied: bool = False
  apply_method: str | None = None
  reason: str = ""
  timings: dict[str, float] = dataclasses.field(default_factory=dict)
  log_head: str = ""
  log_tail: str = ""

  def finish(self) -> dict[str, Any]:
    self.findings = list(dict.fromkeys(self.findings))
    # One truth: resolved means reward 1; any finding takes both away.
    self.resolved = self.resolved and not self.findings
    self.reward = float(self.resolved)
    return dataclasses.asdict(self)


class _Timer:
  def __init__(self, timings: dict[str, float], name: str):
    self.timings, self.name = timings, name

  def __enter__(self):
    self.start = time.monotonic()

  def __exit__(self, *exc):
    self.timings[self.name] = round(time.monotonic() - self.start, 4)


class Executor:

  def __init__(self, repos_dir: str | None = None, cache_dir: str | None = None,
               slots: int | None = None, limits: Limits | None = None, max_twins: int = 3):
    check_host()
    self.max_twins = max_twins  # poisoned twins per run (each re-runs one FAIL_TO_PASS test)
    self.cache = RepoCache(repos_dir, cache_dir)
    self.envs = EnvironmentCache(self.cache.cache_dir)
    self.slots = slots or os.cpu_count() or 1
    if self.slots < 1:
      raise ValueError(f"slots: expected >= 1, got {slots}")
    self.limits = limits or Limits()
    self._sem = asyncio.Semaphore(self.slots)
    self.running = 0
    self._spares: dict[tuple, asyncio.Future[View]] = {}   # (tree, env) -> a view being started
    self._tested: collections.OrderedDict = collections.OrderedDict()   # see _test_patched

  async def run(self, task: dict) -> dict:
    """Grades one task (raises TaskError on a malformed one); returns the verdict dict."""
    parsed = parse_task(task)
    v = Verdict(parsed.instance_id)
    start = time.monotonic()
    try:
      await self._run(parsed, v)
    except RepoError as e:
      v.reason = f"repo: {e}"
    except Exception as e:  # an executor fault must not look like the agent's failure
      v.reason = f"executor error: {type(e).__name__}: {e}"
      v.findings.append("executor_error")
    v.timings["total"] = round(time.monotonic() - start, 4)
    return v.finish()

  async def _run(self, task: Task, v: Verdict) -> None:
    test_patch_paths = integrity.patch_paths(task.test_patch) if task.test_patch.strip() else []
    v.findings += integrity.check_patch(task.patch, test_patch_paths)
    if not task.patch.strip():
      v.reason = "empty patch"
      return
    if integrity.is_unsafe(v.findings):
      v.reason = "patch refused by integrity checks"
      return
    async with self._sem:
      self.running += 1
      try:
        with _Timer(v.timings, "prepare"):
          lower = await self.cache.tree(task.repo, task.base_commit)
          interpreter = host_interpreter()
          if task.environment is not None:
            try:
              interpreter = await self.envs.ensure(task.environment)
            except EnvironmentBuildError as e:   # the task set's fault, not the patch's
              v.reason = f"environment: {e}"
              v.findings.append("environment_error")
              return
          view = await self._take_view(lower, interpreter)
        async with view:
          await self._in_view(task, v, view, lower, test_patch_paths)
      finally:
        self.running -= 1

  async def _take_view(self, lower: str, interpreter: Interpreter) -> View:
    """A fresh view of `lower`: the spare started for it, if any, else a new one. A spare for
    the same tree is started while a run's tests run (`_start_spare`: pytest keeps one core
    busy; a GRPO group grades several samples of one task in a row), at most `slots` spares in
    all; each is a fresh view, never a used one."""
    spare = self._spares.pop((lower, interpreter.key), None)
    view = None
    if spare is not None:
      try:
        view = await spare
      except Exception:   # a spare that failed to start: make one now (and fail loudly if so)
        view = None
      if view is not None and not view.alive():
        await view.close()
        view = None
    if view is None:
      view = await self._new_view(lower, interpreter)
    return view

  def _start_spare(self, lower: str, interpreter: Interpreter) -> None:
    key = (lower, interpreter.key)
    if key in self._spares:
      return
    while len(self._spares) >= self.slots:
      asyncio.ensure_future(self._close_spare(self._spares.pop(next(iter(self._spares)))))
    self._spares[key] = asyncio.ensure_future(self._new_view(lower, interpreter))

  async def _new_view(self, lower: str, interpreter: Interpreter) -> View:
    return await View(lower, self.limits, binds=[(PLUGIN_DIR, PLUGIN_MOUNT)],
                      interpreter=interpreter).start()

  @staticmethod
  async def _close_spare(spare: "asyncio.Future[View]") -> None:
    try:
      view = await spare
    except Exception:
      return
    await view.close()

  async def close(self) -> None:
    """Closes the spare views (they also end with this process: each reads its stdin)."""
    spares, self._spares = list(self._spares.values()), {}
    for spare in spares:
      await self._close_spare(spare)

  async def _in_view(self, task: Task, v: Verdict, view: View, lower: str,
                     test_patch_paths: list[str]) -> None:
    agent_paths = integrity.patch_paths(task.patch)
    tried = None
    if not v.findings and not any(posixpath.basename(p) in integrity.SECTIONED_CONFIG_FILES
                                  for p in agent_paths):
      # The common case in ONE sandbox run (each costs a bwrap start): a patch with no finding
      # touches no held-out, test or config file, so nothing needs restoring and no config needs
      # reading between apply and tests. The test_patch is applied on the host (once per tree),
      # then the sandbox applies the agent's patch and, in the same process, becomes pytest.
      with _Timer(v.timings, "apply"):
        tested = await self._test_patched(lower, task.test_patch)
        if tested is not None:
          for path, content in tested.items():
            _write_into(view, path, content)
      if tested is not None:
        tried = await self._test_and_grade(view, task, v, lower, apply_first=True)
        if tried is None:
          return
        await view.reset()   # `git apply` failed: the rest of the cascade, on a fresh view
    await self._apply_and_restore(task, v, view, lower, test_patch_paths, agent_paths, tried)
    if v.patch_applied and not v.reason:
      await self._test_and_grade(view, task, v, lower, apply_first=False)

  async def _apply_and_restore(self, task: Task, v: Verdict, view: View, lower: str,
                               test_patch_paths: list[str], agent_paths: list[str],
                               tried: str | None) -> None:
    """The apply cascade (after `tried`, the first method's log, if it ran already), then the
    held-out files forced back to base_commit and the test_patch applied, in the sandbox; sets
    `v.reason` when the patch or the test_patch does not apply."""
    protected = list(dict.fromkeys(test_patch_paths + list(task.test_files)
                                   + [p for p in agent_paths if integrity.is_protected(p)]))
    restore, added = self._restore_script(view, lower, task, protected, test_patch=True)
    restore_res = None
    with _Timer(v.timings, "apply"):
      patch_in = view.write_input("agent.diff", task.patch)
      log = [tried] if tried is not None else []
      if tried is None:
        # In one sandbox run: the first method applies, then the held-out files are restored
        # and the test_patch applied.
        name, argv = APPLY_CASCADE[0]
        mark = f"restore-{secrets.token_hex(8)}"   # random: no patch output can forge it
        script = (" ".join(_sh(a) for a in [*argv, patch_in]) + f" || exit {_APPLY_FAILED}\n"
                  f"echo {mark}\n" + restore)
        res = await view.exec(["sh", "-c", script, "restore", *added], env=_GIT_ENV,
                              timeout_s=60)
        applied_out, marked, restore_out = res.output.text().partition(f"{mark}\n")
        log.append(f"$ {name}\n{applied_out}")
        if marked:
          v.patch_applied, v.apply_method = True, name
          restore_res = (res.exit_code, restore_out)
      if not v.patch_applied:
        for name, argv in APPLY_CASCADE[1:]:
          await view.reset()
          res = await view.exec([*argv, patch_in], env=_GIT_ENV, timeout_s=60)
          log.append(f"$ {name}\n{res.output.text()}")
          if res.exit_code == 0:
            v.patch_applied, v.apply_method = True, name
            break
    if not v.patch_applied:
      v.reason = "patch does not apply"
      v.log_tail = "\n".join(log)[-4000:]
      return
    for path in agent_paths:
      finding = integrity.config_finding(path, _read(os.path.join(lower, path)),
                                         _read(view.host_path("work", path)))
      if finding:
        v.findings.append(finding)

    with _Timer(v.timings, "restore"):
      if restore_res is None:
        res = await view.exec(["sh", "-c", restore, "restore", *added], env=_GIT_ENV, timeout_s=60)
        restore_res = (res.exit_code, res.output.text())
      if restore_res[0] == 0:
        # pytest config the agent changed (a finding, reward 0) is put back too, so the
        # statuses stay those of the held-out configuration.
        late = [f.split(": ", 1)[1].split(" (")[0] for f in v.findings
                if f.startswith("touches_pytest_config")]
        late = [p for p in dict.fromkeys(late) if p not in protected]
        if late:
          script, late_added = self._restore_script(view, lower, task, late, test_patch=False)
          res = await view.exec(["sh", "-c", script, "restore", *late_added], env=_GIT_ENV,
                                timeout_s=60)
          restore_res = (res.exit_code, res.output.text())
    if restore_res[0] != 0:
      v.reason = ("restoring held-out tests / applying test_patch failed: "
                  f"{restore_res[1][-1500:]}")
      return
    if task.test_patch.strip():  # the tests must not read which functions the test_patch adds
      os.remove(view.host_path("in", "test.diff"))

  async def _test_patched(self, lower: str, test_patch: str) -> dict[str, bytes | None] | None:
    """The files the test_patch touches, as it leaves them (None: deleted), applied on the host
    to copies from `lower` and cached per (tree, test_patch); None when it does not apply
    cleanly there (the sandbox path then reports why) or touches a symlink."""
    if not test_patch.strip():
      return {}
    key = (lower, hashlib.sha256(test_patch.encode()).hexdigest())
    if key in self._tested:
      self._tested.move_to_end(key)
      return self._tested[key]
    paths = integrity.patch_paths(test_patch)
    if any(integrity.escapes_tree(p) for p in paths):
      return None   # not on the host: the sandbox path applies it (and says why it fails)
    result: dict[str, bytes | None] | None = {}
    with tempfile.TemporaryDirectory(prefix="dockyard-testpatch-") as tmp:
      for path in paths:
        src = os.path.join(lower, path)
        if os.path.islink(src) or (os.path.lexists(src) and not os.path.isfile(src)):
          return None
        if os.path.isfile(src):
          os.makedirs(os.path.dirname(os.path.join(tmp, path)), exist_ok=True)
          shutil.copyfile(src, os.path.join(tmp, path))
      proc = await asyncio.create_subprocess_exec(
          "git", "apply", "--whitespace=nowarn", "-", cwd=tmp, stdin=asyncio.subprocess.PIPE,
          stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
          env={**_GIT_ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "GIT_CEILING_DIRECTORIES": os.path.dirname(tmp)})
      await proc.communicate(test_patch.encode())
      if proc.returncode != 0:
        result = None
      else:
        for path in paths:
          out = os.path.join(tmp, path)
          if os.path.islink(out):
            result = None
            break
          result[path] = open(out, "rb").read() if os.path.isfile(out) else None
    self._tested[key] = result
    while len(self._tested) > 64:
      self._tested.popitem(last=False)
    return result

  async def _test_and_grade(self, view: View, task: Task, v: Verdict, lower: str,
                            apply_first: bool) -> str | None:
    """Canary, twins, the pytest run, the checks and the grade. With `apply_first`, the same
    sandbox run first applies the agent's patch with the cascade's first method and then
    becomes pytest; when that patch does not apply, nothing is graded and the method's log is
    returned (None otherwise)."""
    # The canary goes in the test files' common directory, so pytest finds the same ini file
    # (and rootdir-moving tests/pytest.ini) it would for the test files alone.
    canary_dir = posixpath.commonpath([posixpath.dirname(p) for p in task.test_files])
    if not os.path.isdir(view.host_path("work", canary_dir)) or os.path.islink(
        view.host_path("work", canary_dir)):
      canary_dir = ""
    canary_tag = secrets.token_hex(6)
    canary_file = posixpath.join(canary_dir, f"test_{canary_tag}.py")
    canary_id = f"{canary_file}::test_{canary_tag}"
    fd = os.open(view.host_path("work", canary_file),
                 os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
      # pytest's own failure without a traceback: rendering one costs ~5 ms of every verdict.
      f.write(f"import pytest\n\n\ndef test_{canary_tag}():\n"
              "  pytest.fail('must fail', pytrace=False)\n")
    tail = "_" + secrets.token_hex(6)   # the poison call both originals and twins end with
    with _Timer(v.timings, "twins"):
      twin_list = self._twins(view, task, tail)
    before = await asyncio.to_thread(view.snapshot_upper)

    self._start_spare(lower, view.interpreter)
    with _Timer(v.timings, "tests"):
      exit_code, timed_out, report, output, oracle_findings, apply_log = await self._pytest(
          view, task, canary_file, lower, [t.name for t in twin_list], tail, apply_first)
    if apply_first:
      if apply_log is None:   # pytest never started: nothing to grade
        return f"$ {APPLY_CASCADE[0][0]}\n{output.text()}"
      v.patch_applied, v.apply_method = True, APPLY_CASCADE[0][0]
    v.findings += oracle_findings
    events = grading.parse_events(report)
    found, tamper = grading.statuses(events)
    v.findings += tamper
    if not timed_out:  # a killed run has no canary result; the timeout is its reason
      v.findings += grading.run_checks(events, exit_code, canary_id, found)
      v.findings += grading.twin_checks(found, [(t.original, t.twin) for t in twin_list])
    after = await asyncio.to_thread(view.snapshot_upper)
    v.findings += integrity.run_findings(before, after)
    v.tests_status = grading.expected_statuses(found, task.expected_tests)
    v.resolved, v.pass_rate = grading.grade(v.tests_status, task.fail_to_pass, task.pass_to_pass)
    if len(report) >= _MAX_REPORT_BYTES:
      v.findings.append("report_overflow: the results pipe carried more than 32 MiB")
    text = output.text()
    v.log_head = output.head.decode(errors="replace")[:8000]
    v.log_tail = output.tail.decode(errors="replace")[-8000:] if output.tail else text[-8000:]
    if timed_out:
      v.reason = f"timeout: tests ran past {self.limits.timeout_s} s and were killed"
    elif v.resolved and not v.findings:
      v.reason = "resolved"
    elif v.findings:
      v.reason = "integrity: " + "; ".join(v.findings[:3])
    else:
      bad = [t for t, s in v.tests_status.items() if s not in grading.PASSING]
      v.reason = f"{len(bad)} of {len(v.tests_status)} tests not passing (exit code {exit_code})"
    return None

  def _twins(self, view: View, task: Task, tail: str) -> list[twins.Twin]:
    """Writes poisoned twins of some FAIL_TO_PASS tests into their (held-out) files; they and
    their originals end with a call to `tail`."""
    sources = {}
    for path in dict.fromkeys(t.split("::", 1)[0] for t in task.fail_to_pass):
      text = _read(view.host_path("work", path))
      if text is not None and len(text) < (2 << 20):
        sources[path] = text
    new_texts, twin_list = twins.add_twins(sources, task.fail_to_pass, tail=tail,
                                           limit=self.max_twins)
    for path, text in new_texts.items():
      fd = os.open(view.host_path("work", path), os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
      with os.fdopen(fd, "w") as f:
        f.write(text)
    return twin_list

  def _restore_script(self, view: View, lower: str, task: Task, protected: list[str],
                      test_patch: bool) -> tuple[str, list[str]]:
    """(sh script, its "$@") forcing `protected` back to base_commit (removing those base_commit
    lacks) and, with `test_patch`, applying the test_patch."""
    at_base = [p for p in protected if os.path.isfile(os.path.join(lower, p))
               and not os.path.islink(os.path.join(lower, p))]
    added = [p for p in protected if p not in at_base]
    script = "set -e\n"
    if added:
      script += 'rm -rf -- "$@"\n'
    if at_base:
      script += "git checkout -q HEAD -- " + " ".join(_sh(p) for p in at_base) + "\n"
    if test_patch and task.test_patch.strip():
      test_in = view.write_input("test.diff", task.test_patch)
      script += f"git apply --verbose --whitespace=nowarn {test_in}\n"
    return script, added

  async def _pytest(self, view: View, task: Task, canary_file: str, lower: str,
                    twin_names: list[str], tail: str, apply_first: bool = False):
    """One sandbox run of pytest through the launcher -> (exit code, timed out, report bytes,
    output, oracle findings, apply log). With `apply_first`, `sh` first applies the agent's
    patch (`git apply`; .git is masked, so it applies as to a plain tree) and then execs the
    launcher; the apply log is None when the patch did not apply (pytest never started), and
    the output holds pytest's part only."""
    paths = [f"{WORKDIR}/src", WORKDIR] if os.path.isdir(os.path.join(lower, "src")) else [WORKDIR]
    read_fd, write_fd = os.pipe()
    ask_r, ask_w = os.pipe()          # the plugin asks about an item whose body passed ...
    answer_r, answer_w = os.pipe()    # ... and learns here, only then, whether it is a twin
    config = {"report_fd": write_fd, "ask_fd": ask_w, "answer_fd": answer_r, "tail": tail,
              "paths": paths,
              "plugin_name": "_" + secrets.token_hex(8),
              "args": ["-p", "no:cacheprovider", f"--rootdir={WORKDIR}", "-q", "--tb=short",
                       "--color=no",
                       # A file that fails to import must not stop the others (or the canary).
                       "--continue-on-collection-errors",
                       # The task environment's own options (trusted: the task set's, not the agent's).
                       *view.interpreter.pytest_args,
                       # Absolute paths: no test id can ever read as an option.
                       *[f"{WORKDIR}/{p}" for p in (*task.test_files, canary_file)]]}
    config_fd = pipe_with(json.dumps(config).encode())
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    # -P: neither the script's directory nor the cwd goes on sys.path; -s: no user site; the
    # environment has no PYTHONPATH: the interpreter starts on the stdlib and site-packages only.
    argv = [view.interpreter.executable, "-P", "-s", "-B", f"{PLUGIN_MOUNT}/{LAUNCHER}", str(config_fd)]
    ro = [canary_file] + [p for p in task.test_files if os.path.lexists(view.host_path("work", p))]
    report_task = asyncio.ensure_future(_read_fd(read_fd))
    oracle_task = asyncio.ensure_future(_answer_twins(ask_r, answer_w, frozenset(twin_names)))
    if apply_first:
      mark = f"applied-{secrets.token_hex(8)}"   # random, printed before any agent code runs
      patch_in = view.write_input("agent.diff", task.patch)
      git = " ".join(f"{k}={_sh(val)}" for k, val in _GIT_ENV.items())   # for git alone
      # sh exports PWD: unset, pytest's environment is the one the sandbox path gives it.
      argv = ["sh", "-c", f"{git} {' '.join(_sh(a) for a in APPLY_CASCADE[0][1])} {patch_in} "
              f"|| exit {_APPLY_FAILED}\necho {mark}\nunset PWD\nexec \"$@\"", "apply", *argv]
    try:
      # .git is masked: the history would tell a twin from a test that existed at base_commit.
      res = await view.exec(argv, env=env, ro_files=ro, masks=[".git"],
                            pass_fds=[write_fd, config_fd, ask_w, answer_r])
    finally:
      for fd in (write_fd, config_fd, ask_w, answer_r):
        os.close(fd)
    report = await report_task
    oracle_findings = await oracle_task
    output, apply_log = res.output, None
    if apply_first:
      # The mark is in the head unless git's own output filled it (then: "did not apply", and
      # the cascade redoes the whole run in the sandbox path).
      applied, marked, rest = output.head.partition(f"{mark}\n".encode())
      if marked:
        apply_log = applied.decode(errors="replace")
        output = Output(rest, output.tail, output.total_bytes - len(applied) - len(marked))
    return res.exit_code, res.timed_out, report, output, oracle_findings, apply_log


async def _answer_twins(ask_fd: int, answer_fd: int, names: frozenset[str]) -> list[str]:
  """The twin oracle: one JSON line {"nodeid", "name"} in per item whose body passed, one byte
  out ("1": poison it). Each node id is asked once; a second ask, or a line that is not an ask,
  was written by the code under test: a finding, and from then on every answer is "1"."""
  loop = asyncio.get_running_loop()
  reader = asyncio.StreamReader(limit=_MAX_ASK_BYTES)
  transport, _ = await loop.connect_read_pipe(
      lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(ask_fd, "rb", buffering=0))
  os.set_blocking(answer_fd, False)
  seen: set[str] = set()
  findings: list[str] = []
  try:
    while len(seen) < _MAX_ASKS:
      try:
        line = await reader.readline()
      except ValueError:
        findings.append("oracle_misused: an ask line longer than 4 MiB")
        break
      if not line:
        break
      try:
        ask = json.loads(line)
        nodeid, name = str(ask["nodeid"]), str(ask["name"])
      except (ValueError, KeyError, TypeError):
        findings.append("oracle_misused: a line that is not an ask")
        nodeid, name = "", ""
      if nodeid in seen:
        findings.append(f"oracle_misused: {nodeid or 'a malformed ask'} asked twice")
      seen.add(nodeid)
      try:
        os.write(answer_fd, b"1" if findings or name in names else b"0")
      except OSError:   # nobody reads the answers (pipe full or closed): the plugin fails closed
        findings.append("oracle_misused: answers not read")
        break
  finally:
    transport.close()
    os.close(answer_fd)
  return list(dict.fromkeys(findings))


async def _read_fd(fd: int) -> bytes:
  """Reads a pipe to EOF on the event loop (no thread per run), keeping at most a cap."""
  loop = asyncio.get_running_loop()
  reader = asyncio.StreamReader()
  transport, _ = await loop.connect_read_pipe(
      lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
  chunks, total = [], 0
  try:
    while chunk := await reader.read(65536):
      if total < _MAX_REPORT_BYTES:
        chunks.append(chunk)
      total += len(chunk)
  finally:
    transport.close()
  return b"".join(chunks)[:_MAX_REPORT_BYTES]


def _write_into(view: View, path: str, content: bytes | None) -> None:
  """Puts a file the test_patch leaves into the view (None: removes it), owned by the sandbox
  user like a file `git apply` would write there; never through a symlink."""
  target = view.host_path("work", path)
  if content is None:
    if os.path.lexists(target):
      os.remove(target)
    return
  parent = view.host_path("work")
  for part in path.split("/")[:-1]:
    parent = os.path.join(parent, part)
    if not os.path.lexists(parent):
      os.mkdir(parent, 0o755)
      os.chown(parent, SANDBOX_UID, SANDBOX_UID)
    elif os.path.islink(parent) or not os.path.isdir(parent):
      raise RepoError(f"test_patch path {path!r} crosses a non-directory in the tree")
  existed = os.path.lexists(target)
  fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
  with os.fdopen(fd, "wb") as f:
    f.write(content)
  if not existed:
    os.chown(target, SANDBOX_UID, SANDBOX_UID)


def _read(path: str) -> str | None:
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
  except OSError:
    return None
  with os.fdopen(fd, "rb") as f:
    return f.read(4 << 20).decode(errors="replace")


def _sh(s: str) -> str:
  return shlex.quote(s)

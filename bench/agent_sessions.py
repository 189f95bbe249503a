"""Agent-session overhead: session start vs a bare bwrap start, one exec round trip vs the same
command run bare, and many concurrent sessions with no episode lost.

  python bench/agent_sessions.py [--smoke | --quick]

Side by side in one run, against a real executor server (`start_local_executor`, HTTP, the
client `SandboxClient.open_session`) on the synthetic repo with 40 extra tests: (a) session
start, median, cache warm, vs `bwrap --unshare-all --ro-bind / / true`; (b) one exec round trip
of the agent's typical command, the repo's test suite (`python -m pytest -q tests`), vs the same
command run bare in a ready checkout of the same tree (no isolation, no HTTP), interleaved; the
fixed cost of a trivial command (`true`) both ways is printed too; (c) N sessions at once (32;
--quick 8, --smoke 2), each running the tests, fixing the bug with the edit tool and submitting:
every one must come back resolved. Last line: `RESULT exec_overhead <ratio> x` ((b) session ÷
bare, medians).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dockyard.sandbox import synthetic  # noqa: E402
from dockyard.sandbox.client import SandboxClient  # noqa: E402
from dockyard.sandbox.local import start_local_executor  # noqa: E402

_EXTRA_TESTS = "".join(
    f"\n\ndef test_sub_{i}():\n  assert sub({i} + 1, 1) == {i}\n" for i in range(40))
COMMAND = "python -m pytest -q -p no:cacheprovider tests"
FIX = {"path": "calc/core.py", "old_str": "return a - b\n\n\ndef sub",
       "new_str": "return a + b\n\n\ndef sub"}


def _median_s(fn, reps: int) -> float:
  times = []
  for _ in range(reps):
    start = time.monotonic()
    fn()
    times.append(time.monotonic() - start)
  return statistics.median(times)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="2 repetitions, 2 sessions (seconds; CI)")
  mode.add_argument("--quick", action="store_true", help="few repetitions, 8 sessions (under 60 s)")
  args = parser.parse_args()
  reps, n_sessions = (2, 2) if args.smoke else (6, 8) if args.quick else (20, 32)

  root = tempfile.mkdtemp(prefix="dockyard-bench-sessions-")
  handle = None
  try:
    repos = os.path.join(root, "repos")
    base = synthetic.make_repo(repos, extra={"tests/test_more.py": "from calc.core import sub\n"
                                             + _EXTRA_TESTS})
    ready = os.path.join(root, "ready")   # the same tree as a session's, for the bare baseline
    subprocess.run(["git", "worktree", "add", "-q", "--detach", ready, base], check=True,
                   cwd=os.path.join(repos, synthetic.REPO.replace("/", "__")))
    env = dict(os.environ, PYTHONPATH=ready, PYTHONDONTWRITEBYTECODE="1",
               PATH=f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    task = synthetic.task(base, "")
    handle = start_local_executor(slots=2, repos_dir=repos, cache_dir=os.path.join(root, "cache"),
                                  limits={"timeout_s": 120.0},
                                  sessions={"max_sessions": max(64, n_sessions)},
                                  log_path=os.path.join(root, "server.log"))

    def bare(command: str) -> None:
      proc = subprocess.run(["bash", "-c", command], cwd=ready, env=env, capture_output=True)
      if proc.returncode != 0:
        raise SystemExit(f"bare `{command}` failed:\n{proc.stdout[-2000:]!r}")

    def bare_bwrap() -> None:
      subprocess.run(["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                     check=True)

    async def episode(client: SandboxClient, i: int) -> dict:
      s = await client.open_session(dict(task, instance_id=f"episode-{i}"))
      run = await s.exec(COMMAND)
      if run["exit_code"] != 0:
        raise RuntimeError(f"episode {i}: tests failed in the session: {run['stdout'][-500:]}")
      await s.tool("edit", **FIX)
      return await s.submit()

    async def run() -> None:
      async with SandboxClient([handle.url], max_in_flight=max(64, n_sessions)) as client:
        warm = await client.open_session(task)   # warms the cache (the tree export, once)
        await warm.exec("true")
        await warm.close()
        starts = []
        for _ in range(reps * 3):
          t0 = time.monotonic()
          s = await client.open_session(task)
          starts.append(time.monotonic() - t0)
          await s.close()
        start_s = statistics.median(starts)
        bwrap_s = _median_s(bare_bwrap, reps * 3)
        print(f"session start (HTTP, median of {reps * 3}): {start_s * 1e3:.1f} ms; bare bwrap "
              f"start: {bwrap_s * 1e3:.1f} ms (x{start_s / bwrap_s:.2f})")

        s = await client.open_session(task)
        await s.exec(COMMAND)
        bare(COMMAND)
        sess, plain = [], []
        for _ in range(reps):   # interleaved, so machine load hits both alike
          t0 = time.monotonic()
          res = await s.exec(COMMAND)
          sess.append(time.monotonic() - t0)
          assert res["exit_code"] == 0, res
          plain.append(_median_s(lambda: bare(COMMAND), 1))
        trivial = []
        for _ in range(reps * 3):
          t0 = time.monotonic()
          await s.exec("true")
          trivial.append(time.monotonic() - t0)
        await s.close()
        trivial_s, trivial_bare = statistics.median(trivial), _median_s(lambda: bare("true"),
                                                                          reps * 3)
        e, b = statistics.median(sess), statistics.median(plain)
        print(f"exec `{COMMAND}` (41 tests): session round trip {e:.3f} s, bare {b:.3f} s "
              f"(median of {reps})")
        print(f"exec `true` (the fixed cost): session round trip {trivial_s * 1e3:.1f} ms, bare "
              f"{trivial_bare * 1e3:.1f} ms")

        t0 = time.monotonic()
        verdicts = await asyncio.gather(*(episode(client, i) for i in range(n_sessions)),
                                        return_exceptions=True)
        wall = time.monotonic() - t0
        lost = [v for v in verdicts if not isinstance(v, dict) or not v.get("resolved")]
        print(f"{n_sessions} concurrent sessions (open, run the tests, edit, submit): "
              f"{n_sessions - len(lost)} resolved, {len(lost)} lost, {wall:.1f} s wall "
              f"({n_sessions / wall * 60:.1f} episodes/min; {os.cpu_count()} cores, 2 grading slots)")
        if lost:
          raise SystemExit(f"episodes lost or not resolved: {lost[:3]}")
        print(f"RESULT exec_overhead {e / b:.2f} x")

    asyncio.run(run())
  finally:
    if handle is not None:
      handle.kill()
    subprocess.run(["chmod", "-R", "u+w", root], check=False)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  main()

"""Sandbox overhead: per-verdict wall time vs bare pytest of the same tests, and verdicts/min.

  python bench/sandbox.py [--smoke | --quick]

Side by side in one run, on the synthetic repo (dockyard.sandbox.synthetic, with extra tests so
pytest has some work): (a) bare `python -m pytest` of the task's test files on a ready checkout
(base tree + gold patch + test_patch, no isolation); (b) `Executor.run` of the same task (cache
warm: view, apply cascade, restore, test_patch, canary, twins, bwrap, pytest, grading; the
executor starts a spare view for the same tree beside each run, as for a GRPO group, so from
the second verdict on the view is ready); (c) verdicts/min
for a batch with 1 and with 2 slots. Prints the figures, then one line
`RESULT sandbox_overhead <ratio> x` (b / a, means over the repetitions).
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
from dockyard.sandbox.executor import Executor  # noqa: E402

_EXTRA_TESTS = "".join(
    f"\n\ndef test_sub_{i}():\n  assert sub({i} + 1, 1) == {i}\n" for i in range(40))


def _checkout(repos: str, base: str, dest: str) -> None:
  """A ready checkout for the bare baseline: base tree + gold patch + test_patch."""
  src = os.path.join(repos, synthetic.REPO.replace("/", "__"))
  subprocess.run(["git", "worktree", "add", "-q", "--detach", dest, base], cwd=src, check=True)
  for patch in (synthetic.gold_patch(), synthetic.test_patch()):
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=dest, check=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true", help="one repetition, 2-verdict batches (seconds; CI)")
  mode.add_argument("--quick", action="store_true", help="few repetitions (under 60 s)")
  args = parser.parse_args()
  reps, batch = (1, 2) if args.smoke else (3, 4) if args.quick else (10, 12)

  root = tempfile.mkdtemp(prefix="dockyard-bench-")
  try:
    repos = os.path.join(root, "repos")
    base = synthetic.make_repo(repos, extra={"tests/test_more.py": "from calc.core import sub\n"
                                             + _EXTRA_TESTS})
    task = synthetic.task(base, synthetic.gold_patch())
    task["PASS_TO_PASS"] = task["PASS_TO_PASS"] + [f"tests/test_more.py::test_sub_{i}"
                                                   for i in range(40)]
    ready = os.path.join(root, "ready")
    _checkout(repos, base, ready)
    files = list(dict.fromkeys(t.split("::")[0] for t in task["FAIL_TO_PASS"] + task["PASS_TO_PASS"]))
    env = dict(os.environ, PYTHONPATH=ready, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               PYTHONDONTWRITEBYTECODE="1")

    def bare() -> float:
      start = time.monotonic()
      proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             *files], cwd=ready, env=env, capture_output=True, text=True)
      if proc.returncode != 0:
        raise SystemExit(f"baseline pytest failed:\n{proc.stdout[-2000:]}")
      return time.monotonic() - start

    async def sandboxed(ex: Executor) -> float:
      start = time.monotonic()
      verdict = await ex.run(task)
      if not verdict["resolved"]:
        raise SystemExit(f"sandbox verdict not resolved: {verdict['reason']}")
      return time.monotonic() - start

    async def throughput(slots: int) -> float:
      ex = Executor(repos_dir=repos, cache_dir=os.path.join(root, "cache"), slots=slots)
      start = time.monotonic()
      verdicts = await asyncio.gather(*(ex.run(dict(task, instance_id=f"b{i}"))
                                        for i in range(batch)))
      assert all(v["resolved"] for v in verdicts)
      rate = batch / (time.monotonic() - start) * 60
      await ex.close()
      return rate

    async def run() -> None:
      ex = Executor(repos_dir=repos, cache_dir=os.path.join(root, "cache"), slots=1)
      await sandboxed(ex)  # warm the cache (export + single-commit repo, once per commit)
      bare()
      bare_s, sandbox_s = [], []
      for _ in range(reps):  # interleaved, so machine load hits both alike
        bare_s.append(bare())
        sandbox_s.append(await sandboxed(ex))
      b, s = statistics.mean(bare_s), statistics.mean(sandbox_s)
      print(f"tests per run: {len(task['FAIL_TO_PASS']) + len(task['PASS_TO_PASS'])}")
      print(f"bare pytest on a ready checkout: {b:.3f} s/run (mean of {reps})")
      print(f"sandbox verdict:                 {s:.3f} s/verdict (mean of {reps})")
      # On a machine others load, the fastest of each is the closer estimate of the idle cost.
      print(f"fastest: bare {min(bare_s):.3f} s, verdict {min(sandbox_s):.3f} s "
            f"(ratio {min(sandbox_s) / min(bare_s):.2f} x)")
      await ex.close()
      one, two = await throughput(1), await throughput(2)
      print(f"throughput, {batch} verdicts: 1 slot {one:.1f}/min, 2 slots {two:.1f}/min "
            f"(x{two / one:.2f}; {os.cpu_count()} cores)")
      print(f"RESULT sandbox_overhead {s / b:.2f} x")

    asyncio.run(run())
  finally:
    subprocess.run(["chmod", "-R", "u+w", root], check=False)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  main()

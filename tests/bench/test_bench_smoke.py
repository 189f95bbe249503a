"""Every benchmark runs as the README writes it and reaches its RESULT line (issue 16, part 0).

Each bench in bench/ runs as `python bench/X.py --smoke`: a fresh interpreter, from the repo root,
with the environment the test session has (a user's, after set-up: the package installed), each in
its own process. The smoke mode is the smallest size of the same code path, so a broken import, a
config that grew a requirement (the math config's KL reference) or a renamed API fails here. Only
the exit status and the format of the last stdout line are checked, never the value: under CI load
the figures mean nothing. A second test keeps the README's commands in step with bench/.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "bench", "*.py"))
                 if not os.path.basename(p).startswith("_"))
RESULT = re.compile(r"RESULT [A-Za-z0-9_]+ -?[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)? \S+")
# tests/conftest.py fakes 8 JAX devices for the session; a user's shell has the one real CPU device.
FAKE_DEVICES = "--xla_force_host_platform_device_count=8"


def user_env() -> dict[str, str]:
  env = dict(os.environ)
  if env.get("XLA_FLAGS") == FAKE_DEVICES:
    del env["XLA_FLAGS"]
  return env


def test_benches_found():
  # a glob that matched nothing would make the smoke test below vacuous
  assert {"agent_sessions", "async_vs_sync", "generate", "lora", "packing", "refit", "sandbox",
          "trainer"} <= set(BENCHES), BENCHES


# peer_trl's smoke (~1.5-2 min: two model sides) runs once, in test_peer_trl_smoke.py, which also
# checks its report; the RESULT format check here would repeat it.
SMOKED_ELSEWHERE = {"peer_trl"}


# Benches with a second mode: each mode is smoked too. async_vs_sync's SWE mode starts Ray, the
# sandbox fleet and a vLLM actor and does 10 SFT steps: ~80 s (load 7-18), the slowest smoke here.
MODES = {"trainer": ["--moe"], "async_vs_sync": ["--env=swe"]}


@pytest.mark.slow
@pytest.mark.parametrize("name,flags", [pytest.param(b, f, id=" ".join([b, *f]))
                                        for b in BENCHES if b not in SMOKED_ELSEWHERE
                                        for f in [[]] + [[m] for m in MODES.get(b, [])]])
def test_bench_smoke_reaches_result(name, flags):
  cmd = [sys.executable, f"bench/{name}.py", *flags, "--smoke"]
  shown = " ".join(["python", *cmd[1:]])
  try:
    proc = subprocess.run(cmd, cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=600)
  except subprocess.TimeoutExpired as e:
    pytest.fail(f"`{shown}` ran past {e.timeout} s (smoke mode should take "
                f"seconds)")
  tail = f"--- stdout (tail) ---\n{proc.stdout[-3000:]}\n--- stderr (tail) ---\n{proc.stderr[-3000:]}"
  assert proc.returncode == 0, f"`{shown}` exited {proc.returncode}\n{tail}"
  lines = proc.stdout.strip().splitlines()
  last = lines[-1] if lines else ""
  assert RESULT.fullmatch(last), f"last stdout line is not `RESULT <name> <value> <unit>`: {last!r}\n{tail}"


def test_readme_commands_match_the_benches():
  """Each bench appears in the README as a command; each command names a bench and flags it takes."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  commands = re.findall(r"python bench/(\w+)\.py((?: --\w+)*)", readme)
  assert {name for name, _ in commands} == set(BENCHES), (
      f"README bench commands {sorted({n for n, _ in commands})} vs bench/ {BENCHES}")
  for name, flags in commands:
    with open(os.path.join(ROOT, "bench", f"{name}.py"), encoding="utf-8") as f:
      source = f.read()
    for flag in flags.split():
      assert f'"{flag}"' in source, f"README runs `python bench/{name}.py {flag}`; the bench has no {flag}"

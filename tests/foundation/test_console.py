"""The terminal filter (`dockyard.console`): third-party noise off the terminal, everything in the
run log, errors and dockyard's own lines always shown; the phase lines."""
import io
import logging
import sys
import warnings

import pytest

from dockyard import console

RAY_TOKEN = ("2026-12-04 03:59:56,208\tWARNING authentication_token_setup.py:85 -- Token authentication "
             "is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out.\n")
VLLM_FUTURE = ("\x1b[36m(EngineActorImpl pid=20364)\x1b[0m /venv/lib/python3.11/site-packages/vllm/triton_utils/"
               "dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated\n")


@pytest.mark.parametrize("line", [
    RAY_TOKEN,
    "2026-12-04 04:00:04,024\tINFO worker.py:2038 -- Started a local Ray instance.\n",
    VLLM_FUTURE,
    "(EngineActorImpl pid=20364)   if hasattr(value, \"__dict__\"):\n",
    "(EngineActorImpl pid=20364) Loading safetensors checkpoint shards: 100% Completed | 1/1\n",
    "\x1b[36m(EngineActorImpl pid=2)\x1b[0m \rLoading safetensors checkpoint shards:   0% Completed | 0/1\n",
    "/venv/lib/python3.11/site-packages/jax/_src/x.py:12: DeprecationWarning: old\n",
    "[W1204 04:00:25.289005847 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy\n",
])
def test_third_party_chatter_is_noise(line):
  assert console.is_noise(line)


@pytest.mark.parametrize("line", [
    "grpo: 33%|███▎      | 1/3 [00:10<00:20, reward 0.031]\n",
    "(EngineActorImpl pid=20364) RuntimeError: CUDA out of memory\n",
    "(EngineActorImpl pid=20364) Traceback (most recent call last):\n",
    "(SandboxServer pid=7) WARNING dockyard.sandbox.server: executor restarted\n",
    "Traceback (most recent call last):\n",
    "  File \"/work/dockyard/runner.py\", line 3, in run\n",
    "dockyard.runner.ComponentError: [rollout] ValueError: bad\n",
    "W1204 04:00:25.289 12345 harness.py:12] resumed from checkpoints/latest at step 3\n",
])
def test_errors_and_dockyards_lines_are_shown(line):
  assert not console.is_noise(line)


def test_a_python_warnings_source_line_is_noise_only_after_the_warning():
  src = "  wrapper = lookup(vars(value).get(\"kernel\"))\n"
  assert console.is_noise(src, after_warning=True)
  assert not console.is_noise(src)


def test_tee_logs_everything_and_shows_the_rest():
  term, log = io.StringIO(), io.StringIO()
  tee = console.Tee(term, log)
  text = (RAY_TOKEN + "/x/y.py:3: FutureWarning: old\n  call()\n  File \"a.py\", line 1\n"
          + "plan line\n" + VLLM_FUTURE + "(EngineActorImpl pid=2) \rLoading shards: 0%\n")
  for i in range(0, len(text), 7):    # arbitrary chunks: lines are judged whole
    tee.write(text[i:i + 7])
  tee.write("partial")
  assert term.getvalue() == "  File \"a.py\", line 1\nplan line\n"   # the partial line waits
  tee.close()
  assert term.getvalue().endswith("plan line\npartial")
  assert log.getvalue() == text + "partial"


def test_capture_tees_the_streams_warnings_and_logging_into_the_log(tmp_path, capsys):
  path = tmp_path / "run.log"
  handler = logging.StreamHandler(sys.stderr)   # made before capture, like absl's
  logger = logging.getLogger("dockyard.test_console")
  logger.addHandler(handler)
  logging.getLogger().addHandler(handler)
  logger.propagate = False
  try:
    with console.capture(str(path)):
      print("shown on stdout")
      # what Python's default showwarning writes (pytest records warnings instead)
      sys.stderr.write(warnings.formatwarning("a third-party FutureWarning", FutureWarning, "/venv/lib/x.py", 7,
                                              "  import x"))
      logger.warning("dockyard says so")
      console.note("only in the log")
      assert console.terminal() is not sys.stderr
  finally:
    logging.getLogger().removeHandler(handler)
  out, err = capsys.readouterr()
  assert "shown on stdout" in out
  assert "dockyard says so" in err
  assert "FutureWarning" not in err and "import x" not in err and "only in the log" not in err
  log = path.read_text()
  for want in ("shown on stdout", "/venv/lib/x.py:7: FutureWarning: a third-party FutureWarning",
               "dockyard says so", "only in the log"):
    assert want in log
  assert handler.stream is sys.stderr and not isinstance(sys.stderr, console.Tee)


def test_capture_logs_the_traceback_and_restores_the_streams(tmp_path):
  saved = sys.stdout, sys.stderr
  with pytest.raises(ValueError):
    with console.capture(str(tmp_path / "run.log")):
      raise ValueError("the run broke")
  assert (sys.stdout, sys.stderr) == saved
  assert "ValueError: the run broke" in (tmp_path / "run.log").read_text()


def test_phase_says_how_long_and_whether_it_failed(tmp_path, capsys):
  with console.capture(str(tmp_path / "run.log")):
    with console.phase("starting the engines"):
      pass
    with pytest.raises(RuntimeError):
      with console.phase("starting the sandbox"):
        raise RuntimeError("no")
  err = capsys.readouterr().err
  assert "starting the engines: done in" in err and "starting the sandbox: failed after" in err
  assert "starting the engines: done in" in (tmp_path / "run.log").read_text()

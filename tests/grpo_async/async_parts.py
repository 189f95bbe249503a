"""Shared by the async tests and their subprocess runner: a small math config, a learnable env,
and generators that are slow, hang or fail on purpose (around the JAX bigram fakes)."""
from __future__ import annotations

import threading
import time


from grpo_fakes import BigramGenerator, FirstDigitEnv, math_config  # noqa: F401 (FirstDigitEnv: re-exported)


def async_config(**over):
  """The fakes' math config with async GRPO on and no validation (unless `over` says so)."""
  return math_config(**{"grpo.async_grpo.enabled": True, "grpo.val_period": 0,
                        "grpo.val_at_start": False, **over})


class SlowGenerator(BigramGenerator):
  """The bigram sampler with a delay per call; call numbers in `hang_calls` sleep `hang_s`
  instead, or until `release` is set when one is given (a hung engine), call `fail_on_call`
  raises (a broken one), and calls in `straddle_calls` are still in flight when the next weight
  update arrives. `returned`: the numbers of the calls that have returned.

  Like the vLLM engine, a request runs on one set of weights: generation and weight loads take
  the same lock, so a load waits for the request in progress (in_flight_policy='finish').
  """

  def __init__(self, table, eos_id, delay=0.0, hang_calls=(), hang_s=3.0, fail_on_call=None,
               straddle_calls=(), release: threading.Event | None = None):
    super().__init__(table, eos_id)
    self.delay, self.hang_calls, self.hang_s, self.fail_on_call = delay, set(hang_calls), hang_s, fail_on_call
    self.release, self.returned = release, set()
    self.straddle_calls = set(straddle_calls)   # these wait for a weight update before sampling
    self._waiting = {}       # straddle call -> the version it started on, while it waits
    self._released = set()   # straddle calls whose weights changed and that have not returned yet
    self.calls = self.finished = 0
    self.loads_while_generating = 0   # weight loads that arrived with a call in progress
    self._count_lock, self._engine_lock = threading.Lock(), threading.Lock()

  def generate(self, prompt_ids, n, sampling):
    with self._count_lock:
      call = self.calls
      self.calls += 1
    try:
      if call == self.fail_on_call:
        raise RuntimeError("engine exploded on purpose")
      started_on = self._version
      if call in self.hang_calls and self.release is not None:
        self.release.wait(self.hang_s)
      else:
        time.sleep(self.hang_s if call in self.hang_calls else self.delay)
      if call in self.straddle_calls:
        with self._count_lock:
          self._waiting[call] = started_on
      deadline = time.monotonic() + 30
      while call in self.straddle_calls and self._version == started_on and time.monotonic() < deadline:
        time.sleep(0.01)
      if call in self.straddle_calls:
        with self._count_lock:
          self._released.add(call)
          self._waiting.pop(call, None)
      with self._engine_lock:
        self.ready = True   # the fake's refit-order check is the sync loop's business
        return super().generate(prompt_ids, n, sampling)
    finally:
      with self._count_lock:
        self.finished += 1
        self.returned.add(call)
        self._released.discard(call)

  def update_weights(self, named_tensors, version):
    # A straddle call released by an earlier update must come back (and the loop handle what it
    # brought) before the next one: otherwise whether the run's last step counts it is a race.
    deadline, waited = time.monotonic() + 30, False
    while self._released and time.monotonic() < deadline:
      waited = True
      time.sleep(0.01)
    if waited:
      time.sleep(0.5)   # the loop's thread handles the returned call (microseconds of work)
    with self._count_lock:
      self.loads_while_generating += self.calls > self.finished
    with self._engine_lock:
      super().update_weights(named_tensors, version)
    with self._count_lock:   # the calls waiting on older weights are released by this update
      self._released.update(c for c, v in self._waiting.items() if v != self._version)

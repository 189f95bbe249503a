"""The evaluation's confidence interval (Wilson score)."""
import pytest

from dockyard.eval import wilson_interval


def test_wilson_matches_known_values():
  lo, hi = wilson_interval(5, 10)
  assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
  lo, hi = wilson_interval(0, 20)
  assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
  assert wilson_interval(0, 0) == (0.0, 1.0)

"""The evaluation's statistics: Wilson score interval, the unbiased pass@k estimator (against
brute-force enumeration of k-subsets) and the bootstrap interval over problems."""
import itertools
import math

import numpy as np
import pytest

from dockyard import estimators
from dockyard.estimators import wilson_interval


def test_wilson_matches_known_values():
  lo, hi = wilson_interval(5, 10)
  assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
  lo, hi = wilson_interval(0, 20)
  assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
  assert wilson_interval(0, 0) == (0.0, 1.0)
  # 22 of 200 (the model's greedy rate on two-digit sums): p = 0.11, CI about [0.074, 0.161].
  lo, hi = wilson_interval(22, 200)
  assert lo == pytest.approx(0.0739, abs=1e-3) and hi == pytest.approx(0.1612, abs=1e-3)
  with pytest.raises(ValueError, match="successes"):
    wilson_interval(11, 10)


def test_wilson_covers_the_true_rate_about_95_percent_of_the_time():
  rng = np.random.default_rng(0)
  p, n, trials = 0.11, 200, 4000
  wins = rng.binomial(n, p, size=trials)
  covered = np.mean([lo <= p <= hi for lo, hi in (wilson_interval(int(w), n) for w in wins)])
  assert 0.93 <= covered <= 0.97, covered


def _brute_force_pass_at_k(n, c, k):
  """The fraction of k-subsets of n samples (the first c correct) holding a correct sample."""
  subsets = list(itertools.combinations(range(n), k))
  return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 10])
def test_pass_at_k_equals_enumeration(n):
  for c in range(n + 1):
    for k in range(1, n + 1):
      assert estimators.pass_at_k(n, c, k) == pytest.approx(_brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_closed_forms_and_errors():
  assert estimators.pass_at_k(8, 3, 1) == pytest.approx(3 / 8)       # pass@1 = c / n
  assert estimators.pass_at_k(8, 0, 8) == 0.0 and estimators.pass_at_k(8, 1, 8) == 1.0
  assert estimators.pass_at_k(200, 7, 50) == pytest.approx(1 - math.comb(193, 50) / math.comb(200, 50))
  for bad in [(4, 1, 5), (4, 1, 0), (4, 5, 2), (4, -1, 2)]:
    with pytest.raises(ValueError, match="pass_at_k"):
      estimators.pass_at_k(*bad)
  per = estimators.pass_at_k_per_problem([(8, 0), (8, 1), (8, 8)], 8)
  assert per.tolist() == [0.0, 1.0, 1.0]


def test_pass_at_k_matches_random_k_subsets():
  # Monte Carlo: draw k of the n samples at random; the mean indicator matches the estimator.
  rng = np.random.default_rng(1)
  n, c, k = 8, 2, 3
  draws = [bool(set(rng.choice(n, k, replace=False)) & set(range(c))) for _ in range(20000)]
  assert np.mean(draws) == pytest.approx(estimators.pass_at_k(n, c, k), abs=0.01)


def test_bootstrap_interval():
  assert estimators.bootstrap_ci([0.25] * 50) == (0.25, 0.25)
  rng = np.random.default_rng(2)
  values = rng.random(200)
  lo, hi = estimators.bootstrap_ci(values, resamples=2000, seed=0)
  assert lo < values.mean() < hi
  # About the normal-theory width: 2 x 1.96 x sd / sqrt(n).
  assert hi - lo == pytest.approx(2 * 1.96 * values.std() / np.sqrt(values.size), rel=0.15)
  assert estimators.bootstrap_ci(values, resamples=500, seed=3) == estimators.bootstrap_ci(values, resamples=500, seed=3)
  lo4, hi4 = estimators.bootstrap_ci(np.tile(values, 4), resamples=2000, seed=0)
  assert hi4 - lo4 < (hi - lo) * 0.7   # 4x the problems: about half the width
  assert estimators.bootstrap_ci([]) == (0.0, 1.0)
  with pytest.raises(ValueError, match="resamples"):
    estimators.bootstrap_ci(values, resamples=0)

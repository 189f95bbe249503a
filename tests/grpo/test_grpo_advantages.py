"""Advantage estimators (hand-computed) and reward shaping."""
import numpy as np
import pytest

from dockyard.grpo.advantages import compute_advantages
from dockyard.grpo.shaping import ShapingConfig, overlong_penalty, shape_reward


def test_grpo_leave_one_out_by_hand():
  adv = compute_advantages([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]], "grpo", leave_one_out=True)
  # r=1: baseline (0+0+1)/3 -> 2/3; r=0: baseline 2/3 -> -2/3.
  np.testing.assert_allclose(adv.values[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3], rtol=1e-6)
  np.testing.assert_array_equal(adv.values[1], 0)
  np.testing.assert_array_equal(adv.zero_variance, [False, True])
  assert adv.zero_variance_fraction == 0.5


def test_grpo_mean_baseline_and_std():
  r = [[3.0, 1.0]]
  np.testing.assert_allclose(compute_advantages(r, leave_one_out=False).values, [[1.0, -1.0]])
  # group std (population) is 1 -> unchanged up to eps
  np.testing.assert_allclose(compute_advantages(r, leave_one_out=False, normalize_std=True).values,
                             [[1.0, -1.0]], rtol=1e-5)
  np.testing.assert_allclose(compute_advantages([[4.0, 0.0]], leave_one_out=False,
                                                normalize_std=True).values, [[1.0, -1.0]], rtol=1e-5)


def test_gdpo_normalizes_each_component_then_sums():
  comps = dict(correct=[[1.0, 0.0, 0.0, 0.0]], fmt=[[10.0, 10.0, 0.0, 0.0]])
  adv = compute_advantages([[11.0, 10.0, 0.0, 0.0]], "gdpo", components=comps)
  zc = (np.array([1, 0, 0, 0]) - 0.25) / np.std([1, 0, 0, 0])
  zf = np.array([1, 1, -1, -1.0])
  np.testing.assert_allclose(adv.values[0], zc + zf, rtol=1e-5)
  # a flat component contributes 0 instead of dividing by 0; the group still has signal
  adv = compute_advantages([[1.0, 0.0]], "gdpo", components=dict(a=[[1.0, 0.0]], b=[[5.0, 5.0]]))
  np.testing.assert_allclose(adv.values, [[1.0, -1.0]], rtol=1e-5)
  assert not adv.zero_variance[0]


def test_reinforce_pp_uses_batch_statistics():
  r = np.array([[1.0, 1.0], [0.0, 2.0]])
  adv = compute_advantages(r, "reinforce++")
  np.testing.assert_allclose(adv.values, (r - 1.0) / np.std(r), rtol=1e-5)
  assert adv.zero_variance.tolist() == [True, False]   # reported even without a group baseline


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match="estimator"):
    compute_advantages([[1.0, 0.0]], "ppo")
  with pytest.raises(ValueError, match="group_size"):
    compute_advantages([[1.0]])
  with pytest.raises(ValueError, match="NaN"):
    compute_advantages([[1.0, float("nan")]])
  with pytest.raises(ValueError, match="component 'x'"):
    compute_advantages([[1.0, 0.0]], "gdpo", components=dict(x=[[1.0, 0.0, 1.0]]))


def test_shaping_overlong_ramp_scale_and_malformed():
  cfg = ShapingConfig(scale=2.0, malformed_penalty=0.5, overlong_penalty=1.0, overlong_buffer=4,
                      max_new_tokens=10)
  assert [overlong_penalty(n, cfg) for n in (6, 7, 8, 10, 11)] == [0.0, 0.25, 0.5, 1.0, 1.0]
  assert shape_reward(1.0, False, 3, cfg) == 2.0
  assert shape_reward(1.0, True, 8, cfg) == pytest.approx(2.0 - 0.5 - 0.5)
  assert shape_reward(1.0, True, 8, ShapingConfig()) == 1.0
  with pytest.raises(ValueError, match="malformed_penalty"):
    ShapingConfig(malformed_penalty=-1.0)
  with pytest.raises(ValueError, match="overlong_buffer"):
    ShapingConfig(overlong_penalty=1.0, overlong_buffer=20, max_new_tokens=10)

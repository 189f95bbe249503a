"""A 'sequence' mesh axis (context parallelism) is checked before any model loads, naming the key."""
import pytest

from configs import swe
from dockyard.validate import ConfigError, validate


def _seq(shape=(2, 1, 4, 1), devices=8, arg="tiny"):
  config = swe.get_config(arg)
  config.cluster.cpu_devices = devices
  config.mesh.axes = ("data", "fsdp", "sequence", "tensor")
  config.mesh.shape = shape
  return config


def _rejects(config, key, match):
  with pytest.raises(ConfigError, match=match) as err:
    validate(config)
  assert err.value.key == key


def test_a_sequence_axis_validates():
  validate(_seq())
  validate(_seq((1, -1, 2, 1)))   # fsdp fills the rest


def test_sequence_axis_errors_name_their_key():
  _rejects(_seq((2, 1, 2, 1)), "mesh.shape", "multiplies to 4, but the trainer has 8 devices")
  odd = _seq((1, 1, 8, 1))
  odd.policy.seq_bucket = 36
  _rejects(odd, "policy.seq_bucket", "not a multiple of the 'sequence' mesh axis")
  packed = _seq()
  packed.policy.packing_row_tokens = 1026
  _rejects(packed, "policy.packing_row_tokens", "not a multiple")
  ruled = _seq()
  ruled.mesh.rules = tuple(ruled.mesh.rules) + (("length", "sequence"),)
  _rejects(ruled, "mesh.rules", "splits tokens only")
  _rejects(_seq(arg="torch"), "mesh.shape", "JAX-only")

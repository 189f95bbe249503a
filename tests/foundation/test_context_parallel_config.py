"""A 'sequence' mesh axis (context parallelism) is checked before any model loads, naming the key."""

from configs import swe
from dockyard.validate import validate
from tests.config_overrides import rejects


def _seq(shape=(2, 1, 4, 1), devices=8, arg="tiny"):
  config = swe.get_config(arg)
  config.cluster.cpu_devices = devices
  config.mesh.axes = ("data", "fsdp", "sequence", "tensor")
  config.mesh.shape = shape
  return config


def test_a_sequence_axis_validates():
  validate(_seq())
  validate(_seq((1, -1, 2, 1)))   # fsdp fills the rest


def test_sequence_axis_errors_name_their_key():
  rejects(_seq((2, 1, 2, 1)), "mesh.shape", "multiplies to 4, but the trainer has 8 devices")
  odd = _seq((1, 1, 8, 1))
  odd.policy.seq_bucket = 36
  rejects(odd, "policy.seq_bucket", "not a multiple of the 'sequence' mesh axis")
  packed = _seq()
  packed.policy.packing_row_tokens = 1026
  rejects(packed, "policy.packing_row_tokens", "not a multiple")
  ruled = _seq()
  ruled.mesh.rules = tuple(ruled.mesh.rules) + (("length", "sequence"),)
  rejects(ruled, "mesh.rules", "splits tokens only")
  rejects(_seq(arg="torch"), "mesh.shape", "JAX-only")

"""Qwen3-MoE in the NNX decoder: logits and the load-balancing loss equal transformers' (fp32),
the name map round-trips the experts, router losses reach the train step, the balancing bias
moves and steers routing, and meshes with an expert axis of 1, 2 and 4 agree on loss and gradients."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from jax.sharding import PartitionSpec as P

from dockyard.models import name_map
from dockyard.policy import TrainBatch
from dockyard.trainer_jax import hf_io, moe
from dockyard.trainer_jax import sharding as shd
from dockyard.trainer_jax.loss import nll_loss
from dockyard.trainer_jax.model import token_logprobs
from dockyard.trainer_jax.policy import JaxPolicy

TOL = 1e-4
MOE_AXES = ("data", "fsdp", "expert", "tensor")
MOE_RULES = (("batch", ("data", "fsdp", "expert")), ("embed", "fsdp"), ("mlp", "tensor"),
             ("heads", "tensor"), ("vocab", "tensor"), ("expert", "expert"))


def _sharpen_router(model, scale=30.0):
  """Random init leaves router logits ~0 (near-ties in top-k): scale them so routing is decisive."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("mlp.gate.weight"):
        p.mul_(scale)


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
  """name -> HF dir: 'sparse' (every layer MoE, norm_topk_prob) and 'mixed' (layer 1 dense,
  unnormalised top-k weights, untied embeddings, 3 of 6 experts per token)."""
  from dockyard.models.tiny import make_hf_config
  out = {}
  for name, spec, extra in [
      ("sparse", {"family": "qwen3_moe"}, {}),
      ("mixed", {"family": "qwen3_moe", "tie_word_embeddings": False, "num_experts": 6,
                 "num_experts_per_tok": 3, "norm_topk_prob": False}, {"mlp_only_layers": [1]})]:
    cfg = make_hf_config(spec)
    for k, v in extra.items():
      setattr(cfg, k, v)
    torch.manual_seed(len(out))
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _sharpen_router(model)
    path = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(path)
    out[name] = path
  return out


def _ids(vocab, shape, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


def _padded(vocab, b=4, t=40, seed=0):
  ids = _ids(vocab, (b, t), seed)
  mask = np.ones_like(ids)
  for i, n in enumerate(np.linspace(t // 2, t, b).astype(int)):
    ids[i, n:], mask[i, n:] = 0, 0
  return ids, mask


@nnx.jit
def _forward(model, ids, mask):
  return model(ids, mask)


@pytest.mark.parametrize("name", ["sparse", "mixed"])
def test_logits_and_aux_loss_match_transformers(moe_models, name):
  path = moe_models[name]
  model = hf_io.from_hf(path)
  c = model.config
  assert c.family == "qwen3_moe" and c.is_moe
  assert c.moe_layers == ((0, 1) if name == "sparse" else (0,))
  ids, mask = _padded(c.vocab_size)
  ours = np.asarray(_forward(model, ids, mask))
  hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  with torch.no_grad():
    out = hf(torch.tensor(ids), attention_mask=torch.tensor(mask), output_router_logits=True)
  real = mask.astype(bool)
  diff = np.abs(ours - out.logits.numpy())[real].max()
  assert diff <= TOL, f"max |logits diff| {diff} > {TOL}"
  # The router statistics left by that forward pass give transformers' load-balancing loss.
  stats = moe.router_stats(model)
  assert np.asarray(stats["tokens"]).tolist() == [mask.sum()] * len(c.moe_layers)
  load = np.asarray(stats["load"])
  assert (load.sum(-1) == mask.sum() * c.num_experts_per_tok).all()
  assert (load > 0).sum() > c.num_experts_per_tok   # routing really spreads over experts
  np.testing.assert_allclose(float(moe.aux_loss(stats)), float(out.aux_loss), rtol=1e-5)


def test_name_map_covers_the_experts_both_ways(moe_models, tmp_path):
  src = moe_models["mixed"]
  model = hf_io.from_hf(src)
  c = model.config
  hf_names = [hf for hf, _ in name_map.to_hf(hf_io.named_params(model), c)]
  on_disk = hf_io.read_safetensors(src)
  assert sorted(hf_names) == sorted(on_disk)   # every expert of every sparse layer, nothing else
  assert "model.layers.0.mlp.experts.5.down_proj.weight" in hf_names
  assert "model.layers.1.mlp.gate_proj.weight" in hf_names   # the dense layer keeps its MLP names
  for hf, arr in name_map.to_hf(hf_io.named_params(model), c):
    np.testing.assert_array_equal(arr, on_disk[hf], err_msg=hf)
  # Expert j's HF weight is slice j of the stacked kernel, transposed.
  gate = np.asarray(model.layers[0].mlp.gate_proj[...])
  np.testing.assert_array_equal(gate[4].T, on_disk["model.layers.0.mlp.experts.4.gate_proj.weight"])
  # save_hf writes what transformers loads back bit for bit.
  hf_io.save_hf(model, str(tmp_path), src)
  original = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).state_dict()
  again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).state_dict()
  assert set(original) == set(again)
  for name, tensor in original.items():
    assert torch.equal(tensor, again[name]), name
  with pytest.raises(KeyError, match="lacks"):
    name_map.from_hf({k: v for k, v in on_disk.items() if "experts.3." not in k}, c)


def _batch(vocab, b=8, t=40, seed=0):
  ids, mask = _padded(vocab, b, t, seed)
  loss = mask.copy()
  loss[:, :4] = 0
  return TrainBatch(ids, mask, loss)


def _policy(path, config, mesh=None, **moe_options):
  config.optim.update(warmup_steps=0, lr=1e-2, micro_batch_size=4)
  config.policy.moe = {**dict(aux_loss_coef=0.0, z_loss_coef=0.0, bias_update_rate=0.0), **moe_options}
  mesh = mesh if mesh is not None else shd.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  return JaxPolicy.from_hf(path, config, mesh=mesh)


def test_router_losses_and_balancing_bias_in_the_train_step(moe_models, config, tmp_path):
  coef_aux, coef_z, rate = 0.5, 0.05, 0.01
  config.optim.weight_decay = 0.0   # so that a zero gradient leaves a weight exactly as it was
  policy = _policy(moe_models["sparse"], config, aux_loss_coef=coef_aux, z_loss_coef=coef_z,
                   bias_update_rate=rate)
  assert policy.moe == moe.MoEOptions(aux_loss_coef=coef_aux, z_loss_coef=coef_z, bias_update_rate=rate)
  batch = _batch(policy.model.config.vocab_size, b=4)   # one micro-batch: logprobs' stats = the step's
  policy.logprobs(batch)   # a forward pass with the weights the step starts from: its load
  load = np.asarray(moe.expert_load(policy.model))
  # The router losses alone (a task loss of zero): they move the routers and what feeds them,
  # never the last layer's experts (no router reads their output) nor the final norm.
  zero = lambda lp, m, e: (0.0 * (lp * m).sum(), {})   # noqa: E731
  before = {k: np.asarray(v) for k, v in hf_io.named_params(policy.model).items()}
  out = policy.train_step(batch, zero)
  after = hf_io.named_params(policy.model)
  assert out["moe_aux_loss"] > 1.0 and out["moe_z_loss"] > 0 and out["grad_norm"] > 0
  assert out["loss"] == pytest.approx(coef_aux * out["moe_aux_loss"] + coef_z * out["moe_z_loss"], abs=1e-6)
  for name in ("layers.0.mlp.router.kernel", "layers.1.mlp.router.kernel", "layers.0.mlp.down_proj"):
    assert np.abs(np.asarray(after[name]) - before[name]).max() > 1e-4, name
  for name in ("layers.1.mlp.down_proj", "layers.1.mlp.gate_proj", "final_norm.scale"):
    np.testing.assert_array_equal(np.asarray(after[name]), before[name], err_msg=name)
  # Load metrics, and the bias moved against the load (aux-loss-free balancing).
  share = load / load.mean(-1, keepdims=True)
  assert out["moe_load_max"] == pytest.approx(share.max()) and out["moe_load_min"] == pytest.approx(share.min())
  assert share.max() > 1.0 > share.min()
  for block, layer_load in zip(moe.sparse_layers(policy.model), load):
    np.testing.assert_allclose(np.asarray(block.expert_bias[...]), rate * np.sign(layer_load.mean() - layer_load))
  assert "layers.0.mlp.expert_bias" not in after   # not trained, not exported ...
  learned = [np.asarray(b.expert_bias[...]) for b in moe.sparse_layers(policy.model)]
  policy.save(str(tmp_path))                      # ... but checkpointed with the model
  # A large bias decides the top-k choice: every real token then picks experts 0 and 1.
  for block in moe.sparse_layers(policy.model):
    block.expert_bias[...] = jnp.asarray([5.0, 5.0] + [0.0] * 6)
  policy.logprobs(batch)
  np.testing.assert_array_equal(np.asarray(moe.expert_load(policy.model))[:, :2], batch.attention_mask.sum())
  # ... but not the mixing weights: those stay the unbiased, renormalised probabilities.
  block = moe.sparse_layers(policy.model)[0]
  h = np.random.default_rng(0).standard_normal((1, 6, 128)).astype(np.float32)
  got = np.asarray(nnx.jit(lambda b, h: b(h, jnp.ones(h.shape[:2], bool)))(block, h))[0]
  x = h[0]
  logits = x @ np.asarray(block.router.kernel[...])
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  w = probs[:, :2] / probs[:, :2].sum(-1, keepdims=True)
  silu = lambda v: v / (1 + np.exp(-v))   # noqa: E731
  want = sum(w[:, j:j + 1] * ((silu(x @ np.asarray(block.gate_proj[j])) * (x @ np.asarray(block.up_proj[j])))
                              @ np.asarray(block.down_proj[j])) for j in range(2))
  np.testing.assert_allclose(got, want, atol=1e-5)
  policy.restore(str(tmp_path))
  for block, want in zip(moe.sparse_layers(policy.model), learned):
    np.testing.assert_array_equal(np.asarray(block.expert_bias[...]), want)


needs_8_devices = pytest.mark.skipif(
    jax.device_count() < 8,
    reason=f"needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts); "
           f"JAX has {jax.device_count()}")


def _loss_and_grads(model, ids, mask, coef):
  """NLL + coef * aux loss and its gradients w.r.t. every Param (the train step's objective)."""
  def loss_fn(m):
    logp = token_logprobs(m(ids, mask), ids)
    nll = -(logp * mask).sum() / mask.sum()
    return nll + coef * moe.aux_loss(moe.router_stats(m))
  return nnx.jit(lambda m: nnx.value_and_grad(loss_fn)(m))(model)


@needs_8_devices
def test_expert_parallel_meshes_agree(moe_models):
  path = moe_models["sparse"]
  vocab = 1024
  ids, mask = _padded(vocab, b=8, t=32, seed=5)
  results = {}
  for ep, shape in [(1, (2, 4, 1, 1)), (2, (2, 2, 2, 1)), (4, (1, 1, 4, 2))]:
    mesh = shd.make_mesh(shape, MOE_AXES)
    model = hf_io.from_hf(path, mesh, MOE_RULES)
    kernel = model.layers[0].mlp.gate_proj[...]
    if ep > 1:   # experts really split: each device holds num_experts / ep of them
      assert kernel.sharding.spec[0] == "expert"
      assert kernel.addressable_shards[0].data.shape[0] == model.config.num_experts // ep
    put = jax.sharding.NamedSharding(mesh, P(("data", "fsdp", "expert")))
    loss, grads = _loss_and_grads(model, jax.device_put(ids, put), jax.device_put(mask, put), 0.1)
    results[ep] = float(loss), {".".join(map(str, k)): np.asarray(v[...]) for k, v in nnx.to_flat_state(grads)}
  ref_loss, ref_grads = results[1]
  for ep in (2, 4):
    got_loss, got_grads = results[ep]
    assert got_loss == pytest.approx(ref_loss, abs=1e-5), ep
    assert set(got_grads) == set(ref_grads)
    for name, g in ref_grads.items():
      np.testing.assert_allclose(got_grads[name], g, atol=1e-5, rtol=1e-4, err_msg=f"EP={ep} {name}")
  assert np.abs(ref_grads["layers.1.mlp.down_proj"]).max() > 0

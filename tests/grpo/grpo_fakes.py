"""Small stand-ins for the heavy parts, for unit-testing the GRPO loop's wiring on CPU in seconds.

The real end-to-end test (JAX trainer + CPU vLLM + the refit synchronizer) comes with the
integration issue; these fakes implement the same seams faithfully enough to catch wiring bugs:
  BigramPolicy     a real JAX policy (a [V, V] next-token logit table) implementing `Policy`,
                   including the LossFn micro-batching contract and an optax optimizer.
  BigramGenerator  samples from the same table in NumPy and reports per-token logprobs.
  FakeSynchronizer moves the policy's named weights into the generator and measures a canary.
  math_config      configs/math.py cut down for these fakes (sync loop; the async tests add theirs).
  FirstDigitEnv    a reward a bigram policy can learn.
  run_grpo         `grpo_train` with the source and losses the config selects, as the runner does.
"""
from __future__ import annotations

import os
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dockyard import validate
from dockyard.envs.base import Reward
from dockyard.envs.math import MathEnv
from dockyard.policy import Policy, TrainBatch
from dockyard.rollout.base import Completion, Generator, SamplingParams
from tests.config_overrides import set_dotted

WEIGHT = "bigram.weight"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def math_config(spec: str = "configs/math.py", **over):
  """configs/math.py (or a config built on it, `spec`) at a size the fakes run in seconds;
  `over` = {"dotted.key": value}."""
  config = validate.load_config_file(os.path.join(ROOT, spec))
  config.grpo.num_prompts_per_step, config.grpo.num_generations_per_prompt = 4, 8
  config.grpo.max_num_steps, config.grpo.val_period, config.grpo.max_val_samples = 12, 4, 8
  config.grpo.sft_warmup.steps = 0
  config.grpo.dynamic_sampling = False
  config.loss_fn.reference_policy_kl_penalty = 0.0   # no reference policy among the fakes unless a test adds one
  config.rollout.max_new_tokens = 6
  config.checkpoint.metric, config.checkpoint.save_period, config.checkpoint.keep_top_k = "val/reward_mean", 4, 2
  config.logging.tensorboard, config.logging.png_curve = False, False
  set_dotted(config, over)
  validate.validate(config)
  return config


class FirstDigitEnv(MathEnv):
  """Reward 1 when the completion starts with a digit (after spaces): learnable by a bigram policy
  (its first token is conditioned on the prompt's last token), so GRPO must raise its rate."""

  async def score(self, task, completion):
    return Reward(float(completion.lstrip()[:1].isdigit()), malformed=not completion.strip())


def _bigram_logprobs(table, ids, temperature=1.0):
  lsm = jax.nn.log_softmax(table[ids[:, :-1]] / temperature, axis=-1)
  taken = jnp.take_along_axis(lsm, ids[:, 1:, None], axis=-1)[..., 0]
  return jnp.pad(taken, ((0, 0), (1, 0)))


class BigramPolicy(Policy):
  def __init__(self, vocab_size: int, lr: float = 0.05, micro_batch_size: int = 8, seed: int = 0):
    self.table = jnp.asarray(np.random.default_rng(seed).normal(scale=0.1, size=(vocab_size, vocab_size)),
                             jnp.float32)
    self.base_lr = lr
    self.opt = optax.inject_hyperparams(optax.adam)(learning_rate=lr)
    self.opt_state = self.opt.init(self.table)
    self.micro_batch_size = micro_batch_size
    self._step = 0
    self._grad_fns = {}
    self.lr_calls = []

  @classmethod
  def from_hf(cls, path, config):
    raise NotImplementedError("test fake")

  def logprobs(self, batch: TrainBatch) -> np.ndarray:
    return np.asarray(_bigram_logprobs(self.table, jnp.asarray(batch.input_ids), batch.temperature))

  def topk_logprobs(self, batch: TrainBatch, k: int):
    from dockyard.trainer_jax.model import top_k_logprobs
    ids, lps = top_k_logprobs(self.table[jnp.asarray(batch.input_ids)] / batch.temperature, k)
    mask = np.asarray(batch.attention_mask)[:, :, None]
    return np.asarray(ids) * mask, np.asarray(lps) * mask

  def _grad_fn(self, loss_fn):
    if id(loss_fn) not in self._grad_fns:
      def f(table, ids, mask, extras, temperature):
        if "topk_ids" in extras:   # the top-k contract of dockyard.policy
          from dockyard.trainer_jax.model import gathered_logprobs
          extras = {**extras, "topk_logprobs": gathered_logprobs(table[ids] / temperature, extras["topk_ids"])}
        return loss_fn(_bigram_logprobs(table, ids, temperature), mask, extras)
      self._grad_fns[id(loss_fn)] = (loss_fn, jax.jit(jax.value_and_grad(f, has_aux=True)))
    return self._grad_fns[id(loss_fn)][1]

  def train_step(self, batch: TrainBatch, loss_fn) -> dict[str, float]:
    grad_fn = self._grad_fn(loss_fn)
    m = batch.loss_mask
    totals = dict(total_tokens=np.float32(m.sum()), total_sequences=np.float32((m.sum(-1) > 0).sum()))
    grads, metrics = jnp.zeros_like(self.table), {}
    for lo in range(0, batch.batch_size, self.micro_batch_size):
      sl = slice(lo, lo + self.micro_batch_size)
      extras = {k: v[sl] for k, v in batch.extras.items()} | totals
      (_, mm), g = grad_fn(self.table, jnp.asarray(batch.input_ids[sl]), jnp.asarray(m[sl]), extras,
                           jnp.float32(batch.temperature))
      grads = grads + g
      for k, v in mm.items():
        metrics[k] = metrics.get(k, 0.0) + float(v)
    updates, self.opt_state = self.opt.update(grads, self.opt_state, self.table)
    self.table = optax.apply_updates(self.table, updates)
    self._step += 1
    metrics["grad_norm"] = float(optax.global_norm(grads))
    return metrics

  def set_lr(self, lr):
    self.lr_calls.append(lr)
    self.opt_state.hyperparams["learning_rate"] = jnp.asarray(self.base_lr if lr is None else lr)

  def named_weights(self):
    yield WEIGHT, np.asarray(self.table)

  def save(self, directory: str) -> None:
    os.makedirs(directory)   # like orbax: the directory must not exist yet
    np.savez(os.path.join(directory, "bigram.npz"), table=np.asarray(self.table), step=self._step)

  def restore(self, directory: str) -> None:
    data = np.load(os.path.join(directory, "bigram.npz"))
    self.table, self._step = jnp.asarray(data["table"]), int(data["step"])
    self.opt_state = self.opt.init(self.table)

  @property
  def step(self) -> int:
    return self._step


class BigramGenerator(Generator):
  def __init__(self, table: np.ndarray, eos_id: int):
    self.table, self.eos_id = np.asarray(table, np.float64), eos_id
    self._version, self.ready = 0, True
    self.requests = []

  def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams):
    assert self.ready, "generate() before prepare_for_generation() after a weight update"
    self.requests.append((len(prompt_ids), n, sampling.temperature, sampling.seed))
    rng = np.random.default_rng(sampling.seed)
    out = []
    for prompt in prompt_ids:
      group = []
      for _ in range(n):
        last, toks, lps = prompt[-1], [], []
        for _ in range(sampling.max_tokens):
          # Like vLLM's processed logprobs: of the distribution sampled from (z / T; z when greedy).
          logits = self.table[last] / (sampling.temperature or 1.0)
          lsm = logits - np.logaddexp.reduce(logits)
          if sampling.temperature == 0:
            tok = int(np.argmax(logits))
          else:
            p = np.exp(lsm)
            tok = int(rng.choice(len(p), p=p / p.sum()))
          toks.append(tok)
          lps.append(float(lsm[tok]))
          last = tok
          if tok == self.eos_id:
            break
        reason = "stop" if toks[-1] == self.eos_id else "length"
        group.append(Completion(prompt_ids=list(prompt), token_ids=toks, logprobs=lps,
                                finish_reason=reason, weight_version=self._version))
      out.append(group)
    return out

  def update_weights(self, named_tensors: Iterable, version: int) -> None:
    self.table = np.asarray(dict(named_tensors)[WEIGHT], np.float64)
    self._version, self.ready = version, False

  def prepare_for_generation(self) -> None:
    self.ready = True

  @property
  def weight_version(self) -> int:
    return self._version


class FakeSynchronizer:
  """The `WeightSynchronizer` interface the loop expects; records the order of calls."""

  def __init__(self, policy: BigramPolicy, generator: BigramGenerator):
    self.policy, self.generator = policy, generator
    self.calls: list[str] = []
    self._version = 0

  def sync_weights(self) -> dict:
    self.calls.append("sync_weights")
    self._version += 1
    self.generator.update_weights(self.policy.named_weights(), self._version)
    probe = np.arange(8)[None] % self.generator.table.shape[0]
    want = self.policy.logprobs(TrainBatch(probe, np.ones_like(probe), np.ones_like(probe)))[0, 1:]
    lsm = self.generator.table - np.logaddexp.reduce(self.generator.table, axis=-1, keepdims=True)
    got = lsm[probe[0, :-1], probe[0, 1:]]
    return {"canary_max_abs_logprob_delta": float(np.abs(want - got).max()), "version": self._version,
            "ok": True}

  def refit(self) -> dict:
    metrics = self.sync_weights()
    self.calls.append("prepare_for_generation")
    self.generator.prepare_for_generation()
    return metrics

  @property
  def version(self) -> int:
    return self._version


def run_grpo(config, *, policy, generator, synchronizer, env, tokenizer, train_tasks, val_tasks, workdir,
             **kw):
  """`grpo_train` wired as the runner wires it: the source `config` selects (sync or async), the
  losses of the policy's backend and the update of `grpo.objective` (or `update=` one given)."""
  from dockyard import policy_factory
  from dockyard.grpo.loop import grpo_train
  from dockyard.grpo.source import make_source
  source = make_source(config, generator=generator, env=env, tokenizer=tokenizer, train_tasks=train_tasks,
                       synchronizer=synchronizer)
  return grpo_train(config, source=source, policy=policy, generator=generator, synchronizer=synchronizer,
                    env=env, tokenizer=tokenizer, train_tasks=train_tasks, val_tasks=val_tasks, workdir=workdir,
                    losses=policy_factory.make_losses(config),
                    update=kw.pop("update", None) or policy_factory.make_update(config), **kw)

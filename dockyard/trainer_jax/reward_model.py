"""`JaxRewardModel`: the `dockyard.rm.model.RewardModel` seam on the Flax NNX decoder.

The decoder is `trainer_jax.model.Decoder` loaded by `hf_io.from_hf` (one device, no mesh
sharding, no LoRA, no micro-batching: the first version, sized for models that fit one device);
the head is a [1, hidden] Param with HF's `score.weight` layout, applied to
`Decoder.hidden_states` at each row's last real token. The LM head (an untied `lm_head`) is
never read, so it gets no gradient and AdamW's decoupled weight decay is the only thing that
moves it; it is not saved. One jitted step: loss, gradient, optax AdamW with global-norm
clipping.
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from safetensors.numpy import save_file

from dockyard.models import name_map
from dockyard.models.model_config import ModelConfig
from dockyard.policy import TrainBatch
from dockyard.rm.model import (HEAD_INIT_STD, SCORE_WEIGHT, RewardLossFn, RewardModel,
                               classifier_architecture, last_token_index)
from dockyard.trainer_jax import hf_io


class ScoredDecoder(nnx.Module):
  """Decoder + scalar head: (input_ids, attention_mask, last [B]) -> rewards [B] float32."""

  def __init__(self, decoder, score: np.ndarray):
    self.decoder = decoder
    self.score = nnx.Param(jnp.asarray(score, jnp.float32))   # [1, hidden], HF's score.weight

  def __call__(self, input_ids, attention_mask, last):
    h = self.decoder.hidden_states(input_ids, attention_mask)
    pooled = jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)
    return (pooled @ self.score[...].T)[:, 0]


@nnx.jit(static_argnames=("loss_fn",))
def _train_step(model, optimizer, input_ids, attention_mask, last, extras, loss_fn):
  def loss(model):
    return loss_fn(model(input_ids, attention_mask, last), extras)
  (_, metrics), grads = nnx.value_and_grad(loss, has_aux=True)(model)
  optimizer.update(model, grads)
  return {**metrics, "grad_norm": optax.global_norm(grads)}


@nnx.jit
def _rewards(model, input_ids, attention_mask, last):
  return model(input_ids, attention_mask, last)


class JaxRewardModel(RewardModel):

  def __init__(self, model: ScoredDecoder, optim, source_dir: str):
    self.model, self.source_dir = model, source_dir
    self.optimizer = None
    if optim is not None:
      tx = optax.chain(optax.clip_by_global_norm(float(optim.max_grad_norm)),
                       optax.adamw(float(optim.lr), weight_decay=float(optim.weight_decay)))
      self.optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

  @classmethod
  def from_hf(cls, path: str, config: Any, trainable: bool = True) -> "JaxRewardModel":
    c = ModelConfig.from_pretrained(path)
    tensors = hf_io.read_safetensors(path)
    score = tensors.pop(SCORE_WEIGHT, None)
    if score is None:   # a causal LM: a fresh head
      rng = np.random.default_rng(int(config.run.seed))
      score = rng.normal(0.0, HEAD_INIT_STD, (1, c.hidden_size)).astype(np.float32)
    elif score.shape != (1, c.hidden_size):
      raise ValueError(f"{path}: {SCORE_WEIGHT} has shape {score.shape}, want (1, {c.hidden_size}) "
                       f"(a reward model has one label)")
    if not c.tie_word_embeddings and "lm_head.weight" not in tensors:
      # A saved reward model has no LM head; the decoder module has one, which the head never reads.
      tensors["lm_head.weight"] = np.zeros((c.vocab_size, c.hidden_size), np.float32)
    return cls(ScoredDecoder(hf_io.from_hf(path, tensors=tensors), score),
               config.optim if trainable else None, path)

  @staticmethod
  def _inputs(batch: TrainBatch):
    last = last_token_index(batch)
    return (jnp.asarray(batch.input_ids, jnp.int32), jnp.asarray(batch.attention_mask, jnp.int32),
            jnp.asarray(last))

  def rewards(self, batch: TrainBatch) -> np.ndarray:
    return np.asarray(_rewards(self.model, *self._inputs(batch)), np.float32)

  def train_step(self, batch: TrainBatch, loss_fn: RewardLossFn) -> dict[str, float]:
    if self.optimizer is None:
      raise RuntimeError("this reward model was loaded for scoring (trainable=False)")
    extras = {k: jnp.asarray(v) for k, v in batch.extras.items()}
    metrics = _train_step(self.model, self.optimizer, *self._inputs(batch), extras, loss_fn)
    return {k: float(v) for k, v in metrics.items()}

  def save_hf(self, path: str) -> None:
    import transformers
    os.makedirs(path, exist_ok=True)
    decoder = self.model.decoder
    params = {k: hf_io.to_numpy(v) for k, v in hf_io.named_params(decoder).items()}
    tensors = {name: np.ascontiguousarray(arr) for name, arr in name_map.to_hf(params, decoder.config)
               if name != "lm_head.weight"}
    tensors[SCORE_WEIGHT] = np.asarray(self.model.score[...], np.float32)
    save_file(tensors, os.path.join(path, hf_io.SINGLE), metadata={"format": "pt"})
    for name in hf_io.SIDE_FILES:
      src = os.path.join(self.source_dir, name)
      if name not in ("config.json", "generation_config.json") and os.path.exists(src) \
          and os.path.abspath(self.source_dir) != os.path.abspath(path):
        shutil.copy(src, os.path.join(path, name))
    hf = transformers.AutoConfig.from_pretrained(self.source_dir)
    hf.architectures = classifier_architecture(hf.architectures)
    hf.num_labels = 1
    hf.save_pretrained(path)

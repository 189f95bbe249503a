"""`JaxPolicy.logprobs` / `topk_logprobs` on a batch smaller than a micro-batch (the refit canary's
2-row probe) run on the next power of two of rows (a multiple of the batch axis), not on a full
micro-batch of padded rows that are all computed; the scores are those of the full micro-batch."""
import numpy as np
import pytest

from dockyard.policy import TrainBatch
from tests.trainer_jax.test_jax_token_budget import _policy


def _rows_run(policy, batch) -> int:
  return policy._stack(batch, policy._scoring_rows(batch.batch_size))[0]["input_ids"].shape[1]


@pytest.mark.parametrize("mesh_shape", [(1, 1, 1), (2, 1, 1)])
def test_small_batches_score_on_fewer_rows_alike(tiny_models, config, mesh_shape):
  small = _policy(tiny_models["qwen2"], config, micro_batch_size=8, mesh_shape=mesh_shape)
  vocab = small.model.config.vocab_size
  rng = np.random.default_rng(0)
  ids = rng.integers(3, vocab, (8, 16)).astype(np.int32)
  ones = np.ones_like(ids)
  full = small.logprobs(TrainBatch(ids, ones, ones))       # 8 rows: one full micro-batch
  dp = mesh_shape[0]
  for b, rows in ((1, max(1, dp)), (2, 2), (3, 4), (5, 8), (8, 8)):
    batch = TrainBatch(ids[:b], ones[:b], ones[:b])
    assert _rows_run(small, batch) == rows, (b, dp)
    np.testing.assert_allclose(small.logprobs(batch), full[:b], atol=1e-5)
    top_ids, top_lps = small.topk_logprobs(batch, 3)
    assert top_ids.shape == (b, 16, 3)
    np.testing.assert_allclose(top_lps[:, :, 0], np.max(top_lps, axis=-1))
  ids_full, lps_full = small.topk_logprobs(TrainBatch(ids, ones, ones), 3)
  ids_two, lps_two = small.topk_logprobs(TrainBatch(ids[:2], ones[:2], ones[:2]), 3)
  np.testing.assert_array_equal(ids_two, ids_full[:2])
  np.testing.assert_allclose(lps_two, lps_full[:2], atol=1e-5)

"""A run killed after a step's checkpoint but before its metrics row gets the row back on resume
(`harness.save_latest(row=...)` keeps it in loop_state.json; `harness.restore_last_row` writes it
when metrics.jsonl lacks it), and a row already written is not written twice. Another row of the
same step number (the SFT warm start's, which counts its own steps) does not count as the row."""
from dockyard import workdir as workdir_lib
from dockyard.grpo import harness


def test_the_checkpointed_steps_row_comes_back_once(tmp_path):
  workdir = str(tmp_path)
  writer = workdir_lib.MetricWriter(workdir, tensorboard=False)
  writer.write(2, {"sft/loss": 1.0})                                        # warm start's step 2
  writer.write(1, {"reward/raw_mean": 0.25})
  state = {"step": 2, "row": {"reward/raw_mean": 0.5, "time/train": 1.5}}   # killed before row 2
  harness.restore_last_row(workdir, state, writer)
  harness.restore_last_row(workdir, state, writer)                          # resumed twice
  harness.restore_last_row(workdir, {"step": 1, "row": {"reward/raw_mean": 9.0}}, writer)
  harness.restore_last_row(workdir, {"step": 3}, writer)                    # an older checkpoint: no row
  harness.restore_last_row(workdir, None, writer)                           # a fresh start
  writer.close()
  rows = workdir_lib.read_metrics(f"{workdir}/metrics.jsonl")
  assert rows == [{"step": 2, "sft/loss": 1.0}, {"step": 1, "reward/raw_mean": 0.25},
                  {"step": 2, "reward/raw_mean": 0.5, "time/train": 1.5}]

"""RLAIF's pair making (`dockyard/rlaif.py`) around a scripted engine: the three turns of each
conversation, the principles in turn, the pairs kept; and the config's checks. The real engine and
the DPO loop run in tests/integration/test_dpo_runs.py."""
import pytest
import transformers

from dockyard import validate
from dockyard.models import tiny
from dockyard.rlaif import RlaifConfig, make_pairs
from dockyard.rollout.base import Completion
from tests.config_overrides import with_overrides


class Scripted:
  """Replies by turn: the answer, then a critique, then a revision (the second prompt's revision
  equals its answer, so that pair must be dropped)."""
  def __init__(self, tokenizer):
    self.tok, self.calls = tokenizer, []

  def generate(self, prompt_ids, n, sampling):
    texts = [self.tok.decode(p) for p in prompt_ids]
    self.calls.append(texts)
    turn = len(self.calls)
    out = []
    for i, _ in enumerate(prompt_ids):
      reply = {1: f"answer {i}", 2: f"critique {i}", 3: f"revision {i}" if i != 1 else "answer 1"}[turn]
      ids = self.tok.encode(reply, add_special_tokens=False)
      out.append([Completion(prompt_ids=[], token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop",
                             weight_version=0)])
    return out


def test_pairs_are_revision_over_answer_with_the_principles_in_turn():
  tok = transformers.AutoTokenizer.from_pretrained(tiny.make_tiny_model())
  cfg = RlaifConfig(constitution=("Be exact.", "Be brief."), temperature=1.0, max_new_tokens=8,
                    num_train_prompts=3, num_val_prompts=0)
  prompts = [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(3)]
  engine = Scripted(tok)
  pairs, records = make_pairs(engine, tok, prompts, cfg, seed=0)
  assert [(p.chosen, p.rejected) for p in pairs] == [("revision 0", "answer 0"), ("revision 2", "answer 2")]
  assert pairs[0].messages == tuple(prompts[0])   # the pair answers the original prompt alone
  assert [r["principle"] for r in records] == ["Be exact.", "Be brief.", "Be exact."]
  assert [r["kept"] for r in records] == [True, False, True]
  # The critique turn sees the answer and the principle; the revise turn also sees the critique.
  assert "answer 0" in engine.calls[1][0] and "Be exact." in engine.calls[1][0]
  assert "critique 2" in engine.calls[2][2] and "Rewrite" in engine.calls[2][2]


@pytest.mark.parametrize("override,key", [
    ({"rlaif.constitution": ()}, "rlaif.constitution"),
    ({"rlaif.temperature": 0.0}, "rlaif.temperature"),
    ({"rlaif.max_new_tokens": 200}, "rollout.max_model_len"),
    ({"data.train": "pairs.jsonl"}, "data.train"),
])
def test_bad_rlaif_settings_are_named(override, key):
  config = with_overrides("configs/rlaif.py", override)
  with pytest.raises(validate.ConfigError, match=key.replace(".", r"\.")):
    validate.validate(config)

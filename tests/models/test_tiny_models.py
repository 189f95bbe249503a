"""`tiny.make_tiny_model` with `tokenizer_from`: a small random model that reads another model's
token ids (on-policy distillation's student), cached apart from the locally trained tokenizer's."""
import json
import os

import transformers

from dockyard.models import tiny


def test_a_tiny_model_can_take_another_models_tokenizer(tmp_path):
  donor = tiny.make_tiny_model(dict(vocab_size=512), out_dir=str(tmp_path / "donor"))
  spec = dict(family="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
              tokenizer_from=donor)
  path = tiny.make_tiny_model(spec)
  theirs, ours = (transformers.AutoTokenizer.from_pretrained(p) for p in (donor, path))
  assert ours.get_vocab() == theirs.get_vocab() and ours.chat_template == theirs.chat_template
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  assert config["vocab_size"] == len(theirs) == 512 and config["eos_token_id"] == theirs.eos_token_id
  assert config["model_type"] == "llama" and config["hidden_size"] == 64
  assert path != tiny.make_tiny_model(dict(spec, tokenizer_from=""))   # its own cache entry

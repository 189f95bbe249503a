"""Model files made locally: tiny HF checkpoints and tokenizers for tests and the default run."""

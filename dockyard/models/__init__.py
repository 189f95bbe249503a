"""What a model is, apart from any trainer: `ModelConfig` (model_config.py, from an HF
config.json) and the one HF parameter-name map (name_map.py), shared by both trainers and refit;
tiny HF checkpoints and tokenizers made locally (tiny.py); models that pip packages ship
(packaged.py). Imports no other dockyard package."""

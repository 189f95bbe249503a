"""Experiment launchers: expand a config's sweep into runs; run them locally or as Ray jobs."""

"""Builds the parts a validated config names and runs the loop (filled in by the GRPO issues)."""
from __future__ import annotations


def run(config, paths) -> None:
  raise SystemExit("dockyard: the training loop is not built yet (see the open GRPO issues); "
                   f"the plan above was validated and written to {paths['config']}")

"""Multi-turn agents: tool specs and Hermes-style tool-call parsing (`tools`), token-exact
trajectories built turn by turn through the chat template (`trajectory`), and the episode loop
with its budgets over a `Generator` and a tool executor (`episode`)."""

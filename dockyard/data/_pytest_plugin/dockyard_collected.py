"""A pytest plugin (`-p dockyard_collected`) for the direct runner's `record_collected=True` runs.

It writes the node id of every collected item, in collection order and duplicates kept, as a JSON
list to $DOCKYARD_COLLECTED once collection is done: the outcomes plugin keys its records by node id,
so an id that pytest collected twice (a second report of the same phase, which the sandbox's grader
counts as forged) is only visible here. Trusted builder code, not a sandbox integrity check.
"""
import json
import os


def pytest_collection_finish(session):
  path = os.environ.get("DOCKYARD_COLLECTED")
  if path:
    with open(path, "w") as f:
      json.dump([item.nodeid for item in session.items], f)

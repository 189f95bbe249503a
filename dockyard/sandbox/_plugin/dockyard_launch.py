"""The sandbox's pytest launcher: trusted imports first, repository code last.

  python -P -s -B /dockyard/plugin/dockyard_launch.py <config-fd>

The executor runs this instead of `python -m pytest`. With -P the script's directory and the
working directory are not on sys.path, and the environment carries no PYTHONPATH, so at start-up
sys.path is the standard library and site-packages only: a repository file named like `pytest`,
`json`, `sitecustomize` or a `.pth` file is never imported by the interpreter or by this script.
The run's configuration (pytest arguments, the fds of the results pipe and of the twin oracle, a
random name for the plugin module) arrives on a pipe that is read to EOF and closed here, before any repository
code runs, so the code under test cannot read it back from argv, the environment or a file.

Then pytest and the results plugin are imported (the plugin by file path, under the random name),
the repository paths are put on sys.path after the standard library and before site-packages
(the repo's own package must win over an installed copy; a repo module named like a stdlib one
must not win over the stdlib), PYTHONPATH is set for the tests' own subprocesses, and
`pytest.main(args, plugins=[plugin])` runs.
This file must import nothing from dockyard: inside the sandbox only this directory is mounted.
"""
import importlib.util
import json
import os
import sys


def _read_config(fd):
  chunks = []
  while True:
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      break
    chunks.append(chunk)
  os.close(fd)
  return json.loads(b"".join(chunks))


def main():
  config = _read_config(int(sys.argv[1]))
  import pytest  # noqa: F401 - the real one, from site-packages: the repo is not on sys.path yet

  here = os.path.dirname(os.path.abspath(__file__))
  spec = importlib.util.spec_from_file_location(
      config["plugin_name"], os.path.join(here, "dockyard_report_plugin.py"))
  plugin = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(plugin)
  plugin.configure(config["report_fd"], config["ask_fd"], config["answer_fd"], config["tail"])

  site = [i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))]
  at = site[0] if site else len(sys.path)
  sys.path[at:at] = config["paths"]
  os.environ["PYTHONPATH"] = os.pathsep.join(config["paths"])
  sys.argv = ["pytest", *config["args"]]
  del config
  sys.exit(pytest.main(sys.argv[1:], plugins=[plugin]))


if __name__ == "__main__":
  main()

r"""Builds dockyard's offline SWE task set (SWE-bench schema) from pinned PyPI sdists, SWE-smith style.

  options.py   `Options`: every setting of a build, declared once (the CLI's flags are made from it)
  package.py   `PackageBuilder`: one package's sdist -> validated task records
  task_set.py  `build`: every package (resumable per package), then the split files and the manifest
  manifest.py  the split files, `tiny/train.jsonl`, `manifest.json`; `setup_repos` from them

The command line is `python -m dockyard.data.build_swe_tasks` (`dockyard/data/build_swe_tasks.py`).
"""

"""Generated Terminal-Bench-style shell tasks: an instruction, a starting directory, a checker.

A task is a record the sandbox serves as a session (`dockyard.sandbox.task.TerminalTask`):

  {"instance_id": "text-0003", "kind": "terminal", "family": "text",
   "instruction": "...",                 # what the agent is asked (its prompt)
   "files": {"log.txt": "..."},          # the starting directory, /testbed in the sandbox
   "setup": "tar czf ...",               # bash run there before the agent starts ('' for none)
   "check": "test ...",                  # bash run after the episode: exit 0 passes (host side only)
   "oracle": ["mkdir -p out", ...]}      # commands that solve it, each one bash call from /testbed

Like a Terminal-Bench task (instruction, environment, reference solution, tests run after the
agent), but generated: `make_tasks(seed, per_family)` draws `per_family` tasks from each family's
templates with a `random.Random` seeded by (seed, family, index), so the set is the same on every
machine and nothing is committed. Families: files, text, scripts, git, archives. `split` holds
out whole families (success there measures transfer to kinds of tasks never trained on) and/or
the last `heldout_fraction` of each train family's instances (the same templates with new names
and contents: success there measures generalization within the kinds trained on). Every task's oracle passes its checker and doing nothing fails it, through
the real sandbox (tests/sandbox/test_terminal_tasks.py). Checkers read only /testbed and use only
coreutils, grep, awk, sed, git, tar and gzip.
"""
from __future__ import annotations

import random
import shlex
from typing import Any, Callable, Sequence

FAMILIES = ("files", "text", "scripts", "git", "archives")

_WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo",
          "juniper", "kelp", "lumen", "maple", "nectar", "onyx", "pepper", "quartz", "raven",
          "saffron", "tundra", "umber", "velvet", "willow", "xenon", "yarrow", "zephyr")
_LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")
_GIT_ID = ("git config user.email agent@dockyard && git config user.name agent")


def _words(rng: random.Random, k: int) -> list[str]:
  return rng.sample(_WORDS, k)


def _q(s: str) -> str:
  return shlex.quote(s)


def _file_is(path: str, text: str) -> str:
  """A check that `path` holds exactly `text` (compared through printf, so no trailing-newline doubt)."""
  return f"test -f {_q(path)} && test \"$(cat {_q(path)}; printf x)\" = {_q(text + 'x')}"


def _git_init(message: str = "initial") -> str:
  return f"git init -q && {_GIT_ID} && git add -A && git commit -qm {_q(message)}"


# --- files ---------------------------------------------------------------------------------------

def _files_mkdir(rng):
  a, b, c = _words(rng, 3)
  name = f"{rng.choice(_WORDS)}.txt"
  path = f"{a}/{b}/{c}/{name}"
  return dict(instruction=f"Create the directory {a}/{b}/{c} and inside it an empty file named {name}.",
              files={"README": "workspace\n"}, setup="",
              check=f"test -d {a}/{b}/{c} && test -f {path} && test ! -s {path}",
              oracle=[f"mkdir -p {a}/{b}/{c} && touch {path}"])


def _files_rename(rng):
  names = _words(rng, rng.randint(3, 5))
  files = {f"notes/{n}.txt": f"{n} {i}\n" for i, n in enumerate(names)}
  check = " && ".join([f"test ! -e notes/{n}.txt && " + _file_is(f"notes/{n}.md", f"{n} {i}\n")
                       for i, n in enumerate(names)])
  return dict(instruction="Rename every .txt file in the notes directory so it ends in .md "
                          "instead (notes/x.txt becomes notes/x.md); keep their contents.",
              files=files, setup="", check=check,
              oracle=["for f in notes/*.txt; do mv \"$f\" \"${f%.txt}.md\"; done"])


def _files_move_matching(rng):
  word = rng.choice(_WORDS)
  others = [w for w in _words(rng, 6) if w != word][:5]
  hits = rng.sample(others, 2)
  files = {f"inbox/{w}.txt": (f"about {word} and {w}\n" if w in hits else f"about {w}\n")
           for w in others}
  check = " && ".join([f"test -f keep/{w}.txt && test ! -e inbox/{w}.txt" if w in hits
                       else f"test -f inbox/{w}.txt && test ! -e keep/{w}.txt" for w in others])
  return dict(instruction=f"Move every file in inbox/ whose contents mention the word '{word}' "
                          "into a new directory keep/ (same file names); leave the others.",
              files=files, setup="", check=check,
              oracle=[f"mkdir -p keep && grep -l {_q(word)} inbox/* | xargs -I{{}} mv {{}} keep/"])


def _files_delete_tmp(rng):
  keep, drop = _words(rng, 3), [f"{w}.tmp" for w in _words(rng, 3)]
  dirs = ("", "cache/", "cache/deep/")
  files = {}
  for i, w in enumerate(keep):
    files[f"{dirs[i % 3]}{w}.dat"] = f"{w}\n"
  for i, w in enumerate(drop):
    files[f"{dirs[(i + 1) % 3]}{w}"] = "scratch\n"
  check = ("test -z \"$(find . -name '*.tmp' -not -path './.git/*')\" && "
           + " && ".join(f"test -f {_q(p)}" for p in files if p.endswith(".dat")))
  return dict(instruction="Delete every file ending in .tmp anywhere under the current directory; "
                          "keep all other files.",
              files=files, setup="", check=check, oracle=["find . -name '*.tmp' -type f -delete"])


def _files_executable(rng):
  name = f"{rng.choice(_WORDS)}.sh"
  other = f"{rng.choice([w for w in _WORDS if w + '.sh' != name])}.sh"
  files = {f"bin/{name}": "#!/bin/sh\necho ok\n", f"bin/{other}": "#!/bin/sh\necho no\n"}
  return dict(instruction=f"Make bin/{name} executable (only that file), so ./bin/{name} runs.",
              files=files, setup="",
              check=f"test -x bin/{name} && test ! -x bin/{other} && test \"$(./bin/{name})\" = ok",
              oracle=[f"chmod +x bin/{name}"])


# --- text ----------------------------------------------------------------------------------------

def _text_count(rng):
  level = rng.choice(_LEVELS)
  lines = [f"2026-01-{d:02d} {rng.choice(_LEVELS)} {rng.choice(_WORDS)} event"
           for d in range(1, rng.randint(12, 30))]
  n = sum(f" {level} " in ln for ln in lines)
  return dict(instruction=f"Count the lines of app.log that have the level {level} and write just "
                          "that number to count.txt.",
              files={"app.log": "\n".join(lines) + "\n"}, setup="",
              check=f"test \"$(tr -d ' \\n' < count.txt)\" = {n}",
              oracle=[f"grep -c ' {level} ' app.log > count.txt"])


def _text_sort_unique(rng):
  names = [rng.choice(_WORDS) for _ in range(rng.randint(8, 14))]
  want = "".join(f"{w}\n" for w in sorted(set(names)))
  return dict(instruction="Write the distinct names of names.txt, sorted alphabetically, one per "
                          "line, to unique.txt.",
              files={"names.txt": "".join(f"{w}\n" for w in names)}, setup="",
              check=_file_is("unique.txt", want), oracle=["sort -u names.txt > unique.txt"])


def _text_replace(rng):
  old, new = _words(rng, 2)
  keys = _words(rng, 4)
  lines = [f"{k} = {old if i % 2 == 0 else k}" for i, k in enumerate(keys)]
  text = "[main]\n" + "\n".join(lines) + "\n"
  want = text.replace(old, new)
  return dict(instruction=f"In settings.ini replace every occurrence of '{old}' by '{new}', in place.",
              files={"settings.ini": text}, setup="", check=_file_is("settings.ini", want),
              oracle=[f"sed -i 's/{old}/{new}/g' settings.ini"])


def _text_column_sum(rng):
  rows = [(rng.choice(_WORDS), rng.randint(1, 99), rng.randint(1, 99)) for _ in range(rng.randint(4, 9))]
  col = rng.choice(("qty", "price"))
  total = sum(r[1] if col == "qty" else r[2] for r in rows)
  k = 2 if col == "qty" else 3
  csv = "item,qty,price\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows)
  return dict(instruction=f"data.csv has a header line. Sum its '{col}' column and write just the "
                          "total to total.txt.",
              files={"data.csv": csv}, setup="",
              check=f"test \"$(tr -d ' \\n' < total.txt)\" = {total}",
              oracle=[f"awk -F, 'NR > 1 {{ s += ${k} }} END {{ print s }}' data.csv > total.txt"])


def _text_head(rng):
  n = rng.randint(2, 5)
  lines = [f"line {i} {rng.choice(_WORDS)}" for i in range(1, rng.randint(8, 15))]
  want = "".join(f"{ln}\n" for ln in lines[:n])
  return dict(instruction=f"Write the first {n} lines of story.txt to top.txt.",
              files={"story.txt": "".join(f"{ln}\n" for ln in lines)}, setup="",
              check=_file_is("top.txt", want), oracle=[f"head -n {n} story.txt > top.txt"])


# --- scripts -------------------------------------------------------------------------------------

def _scripts_add(rng):
  a, b = rng.randint(1, 50), rng.randint(1, 50)
  return dict(instruction="Write a bash script add.sh that prints the sum of its two integer "
                          "arguments (bash add.sh 2 3 prints 5).",
              files={"README": "scripts go here\n"}, setup="",
              check=f"test \"$(bash add.sh {a} {b})\" = {a + b} && test \"$(bash add.sh 0 0)\" = 0",
              oracle=["printf '%s\\n' '#!/bin/bash' 'echo $(( $1 + $2 ))' > add.sh"])


def _scripts_count_files(rng):
  d = rng.choice(_WORDS)
  n = rng.randint(2, 6)
  files = {f"{d}/f{i}.txt": "x\n" for i in range(n)}
  return dict(instruction="Write a bash script count.sh that prints how many regular files are "
                          f"directly inside the directory given as its argument (try: bash count.sh {d}).",
              files=files, setup="",
              check=(f"test \"$(bash count.sh {d} | tr -d ' ')\" = {n} && mkdir -p /tmp/e && "
                     "touch /tmp/e/a /tmp/e/b && test \"$(bash count.sh /tmp/e | tr -d ' ')\" = 2"),
              oracle=["printf '%s\\n' '#!/bin/bash' 'find \"$1\" -maxdepth 1 -type f | wc -l' > count.sh"])


def _scripts_fix(rng):
  name = rng.choice(_WORDS).capitalize()
  return dict(instruction="greet.sh should print 'Hello, NAME!' for its argument NAME (bash greet.sh "
                          f"{name} prints 'Hello, {name}!') but it has a bug. Fix it.",
              files={"greet.sh": "#!/bin/bash\necho \"Helo, $2!\"\n"}, setup="",
              check=(f"test \"$(bash greet.sh {name})\" = 'Hello, {name}!' && "
                     "test \"$(bash greet.sh Zed)\" = 'Hello, Zed!'"),
              oracle=["sed -i 's/Helo, \\$2/Hello, $1/' greet.sh"])


def _scripts_reverse(rng):
  lines = _words(rng, rng.randint(3, 6))
  return dict(instruction="Write a bash script rev.sh that prints the lines of the file given as its "
                          "argument in reverse order (last line first).",
              files={"list.txt": "".join(f"{w}\n" for w in lines)}, setup="",
              check=(f"test \"$(bash rev.sh list.txt)\" = {_q(chr(10).join(reversed(lines)))} && "
                     "printf '1\\n2\\n' > /tmp/two && test \"$(bash rev.sh /tmp/two)\" = \"$(printf '2\\n1')\""),
              oracle=["printf '%s\\n' '#!/bin/bash' 'tac \"$1\"' > rev.sh"])


# --- git -----------------------------------------------------------------------------------------
# Checkers read the repository with hooks and fsmonitor off, so a planted .git/config runs nothing.
_GIT = "git -c core.fsmonitor=false -c core.hooksPath=/dev/null"


def _git_commit(rng):
  w = rng.choice(_WORDS)
  msg = f"Add {w} notes"
  return dict(instruction=f"This is a git repository. Commit the untracked file {w}.md with the "
                          f"message '{msg}'.",
              files={"README.md": "project\n", f"{w}.md": f"# {w}\n"},
              setup=f"mv {w}.md /tmp/ && {_git_init()} && mv /tmp/{w}.md .",
              check=(f"test \"$({_GIT} log -1 --format=%s)\" = {_q(msg)} && "
                     f"test \"$({_GIT} rev-list --count HEAD)\" = 2 && "
                     f"{_GIT} ls-files --error-unmatch {w}.md >/dev/null 2>&1 && "
                     f"test -z \"$({_GIT} status --porcelain)\""),
              oracle=[f"git add {w}.md && git commit -qm {_q(msg)}"])


def _git_branch(rng):
  b = f"feature-{rng.choice(_WORDS)}"
  return dict(instruction=f"In this git repository create a branch named {b} at the current commit "
                          "and switch to it.",
              files={"main.txt": "main\n"}, setup=_git_init(),
              check=(f"test \"$({_GIT} rev-parse --abbrev-ref HEAD)\" = {b} && "
                     f"test \"$({_GIT} rev-list --count {b})\" = 1 && "
                     f"test \"$({_GIT} log -1 --format=%s {b})\" = initial"),
              oracle=[f"git checkout -q -b {b}"])


def _git_restore(rng):
  w = rng.choice(_WORDS)
  return dict(instruction=f"{w}.txt has uncommitted changes in this git repository. Throw them "
                          "away: restore the file to its last committed version.",
              files={f"{w}.txt": f"{w} original\n"},
              setup=f"{_git_init()} && echo broken >> {w}.txt",
              check=_file_is(f"{w}.txt", f"{w} original\n") + f" && test -z \"$({_GIT} status --porcelain)\"",
              oracle=[f"git checkout -- {w}.txt"])


def _git_tag(rng):
  tag = f"v{rng.randint(0, 3)}.{rng.randint(0, 9)}.{rng.randint(0, 9)}"
  w = rng.choice(_WORDS)
  return dict(instruction=f"Tag the latest commit of this git repository (the one titled '{w}') "
                          f"with the tag {tag}.",
              files={"a.txt": "a\n"},
              setup=f"{_git_init()} && echo b > b.txt && git add b.txt && git commit -qm {_q(w)}",
              check=(f"test \"$({_GIT} rev-parse {tag}^{{commit}})\" = \"$({_GIT} rev-parse HEAD)\" && "
                     f"test \"$({_GIT} log -1 --format=%s {tag})\" = {_q(w)}"),
              oracle=[f"git tag {tag}"])


# --- archives ------------------------------------------------------------------------------------

def _archives_create(rng):
  names = _words(rng, 3)
  files = {f"data/{n}.txt": f"{n}\n" for n in names}
  check = ("test -f backup.tar.gz && rm -rf /tmp/x && mkdir /tmp/x && tar xzf backup.tar.gz -C /tmp/x && "
           + " && ".join(_file_is(f"/tmp/x/data/{n}.txt", f"{n}\n") for n in names))
  return dict(instruction="Pack the data directory into a gzip-compressed tar archive backup.tar.gz "
                          "(extracting it must give data/...).",
              files=files, setup="", check=check, oracle=["tar czf backup.tar.gz data"])


def _archives_extract(rng):
  names = _words(rng, rng.randint(2, 4))
  files = {f"src/{n}.cfg": f"{n}={i}\n" for i, n in enumerate(names)}
  check = " && ".join(_file_is(f"out/{n}.cfg", f"{n}={i}\n") for i, n in enumerate(names))
  return dict(instruction="Extract the archive bundle.tar.gz into a new directory out/ (its files "
                          "must end up directly in out/).",
              files=files, setup="tar czf bundle.tar.gz -C src . && rm -rf src", check=check,
              oracle=["mkdir -p out && tar xzf bundle.tar.gz -C out"])


def _archives_list(rng):
  names = sorted(f"{n}.log" for n in _words(rng, rng.randint(3, 5)))
  files = {f"pkg/{n}": "x\n" for n in names}
  want = "".join(f"{n}\n" for n in names)
  return dict(instruction="Write the names of the files in the archive logs.tar.gz (just the names, "
                          "no directories), sorted, one per line, to contents.txt. Do not extract it here.",
              files=files, setup="tar czf logs.tar.gz -C pkg . && rm -rf pkg",
              check=_file_is("contents.txt", want) + " && test ! -e pkg",
              oracle=["tar tzf logs.tar.gz | grep -v '/$' | sed 's|.*/||' | sort > contents.txt"])


def _archives_gzip(rng):
  w = rng.choice(_WORDS)
  lines = "".join(f"{w} {i}\n" for i in range(rng.randint(5, 20)))
  return dict(instruction=f"Compress {w}.log with gzip so that only {w}.log.gz remains.",
              files={f"{w}.log": lines}, setup="",
              check=(f"test ! -e {w}.log && test -f {w}.log.gz && "
                     f"test \"$(gzip -dc {w}.log.gz; printf x)\" = {_q(lines + 'x')}"),
              oracle=[f"gzip {w}.log"])


TEMPLATES: dict[str, Sequence[Callable[[random.Random], dict]]] = {
    "files": (_files_mkdir, _files_rename, _files_move_matching, _files_delete_tmp, _files_executable),
    "text": (_text_count, _text_sort_unique, _text_replace, _text_column_sum, _text_head),
    "scripts": (_scripts_add, _scripts_count_files, _scripts_fix, _scripts_reverse),
    "git": (_git_commit, _git_branch, _git_restore, _git_tag),
    "archives": (_archives_create, _archives_extract, _archives_list, _archives_gzip),
}


def make_tasks(seed: int = 0, per_family: int = 24,
               families: Sequence[str] = FAMILIES) -> list[dict[str, Any]]:
  """`per_family` tasks of each family, the family's templates taken in turn; deterministic in
  (seed, family, index)."""
  unknown = sorted(set(families) - set(TEMPLATES))
  if unknown:
    raise ValueError(f"terminal task families {unknown}: unknown; known: {list(FAMILIES)}")
  if per_family < 1:
    raise ValueError(f"tasks per family must be >= 1, got {per_family}")
  tasks = []
  for family in families:
    templates = TEMPLATES[family]
    for i in range(per_family):
      rng = random.Random(f"{seed}:{family}:{i}")
      t = templates[i % len(templates)](rng)
      tasks.append({"instance_id": f"{family}-{i:04d}", "kind": "terminal", "family": family,
                    "template": templates[i % len(templates)].__name__.lstrip("_"), **t})
  return tasks


def split(tasks: Sequence[dict], train_families: Sequence[str], heldout_families: Sequence[str],
          heldout_fraction: float = 0.0) -> tuple[list[dict], list[dict]]:
  """(train, held-out): the held-out families' tasks, plus the last round(n * heldout_fraction)
  of each train family's n tasks (templates are taken in turn, so a held-out block of at least
  as many tasks as the family has templates covers every template). A family may not be in both
  lists; every train family keeps at least one task."""
  both = sorted(set(train_families) & set(heldout_families))
  if both:
    raise ValueError(f"families {both} are in both the train and the held-out split")
  if not 0.0 <= heldout_fraction < 1.0:
    raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
  train, heldout = [], [t for t in tasks if t["family"] in heldout_families]
  for family in train_families:
    own = [t for t in tasks if t["family"] == family]
    keep = len(own) - round(len(own) * heldout_fraction)
    if keep < 1:
      raise ValueError(f"heldout_fraction={heldout_fraction} leaves no {family!r} task to train on")
    train += own[:keep]
    heldout += own[keep:]
  return train, heldout

r"""Evaluation on the test split: pass@1 of one sample per task at `rollout.val_temperature`
(greedy at 0) with a 95% Wilson interval, through the same code path as validation
(`grpo.harness.run_validation`); then, when `eval.pass_k > 0`, `eval.num_samples` samples per task at
`eval.temperature` and the unbiased pass@k (and pass@1 of those samples), each with a 95%
percentile-bootstrap interval over tasks (`dockyard.estimators`).

  python -m dockyard.launch --config=configs/eval.py:set=math_smollm --workdir=workdirs/eval_math \
      [--config.policy.model_name_or_path=/path/to/hf/checkpoint]

configs/eval.py names the local sets; `--config.run.mode=eval` on a training config does the same
on that config's held-out split. An agent config (one with an `agent` section) plays each sample as
an episode in a session (`grpo.episodes.EpisodeGroups`), as its training and validation do.
The runner calls `evaluate` in eval mode (the same validation of the config, the same parts, no
trainer); this module imports nothing that leads back to the runner or the launcher.
Writes eval.json (the numbers), eval_table.md (them as a Markdown table, also printed) and
eval_samples.jsonl (every completion, its reward and success) into the workdir.
"""
from __future__ import annotations

import asyncio
import json
import os

import numpy as np

from dockyard import estimators
from dockyard.rollout.base import SamplingParams

SAMPLES = "eval_samples.jsonl"
TABLE = "eval_table.md"


def sampled_pass_at_k(config, *, generator, env, tokenizer, tasks, loop, max_in_flight: int,
                      records: list, episodes=None) -> dict:
  """`eval.num_samples` completions per task at `eval.temperature`: pass@1 and pass@k with CIs."""
  from dockyard.grpo.harness import success_of
  from dockyard.grpo.step import collect_groups, score_groups
  eval_cfg, rollout = config.eval, config.rollout
  n, k = int(eval_cfg.num_samples), int(eval_cfg.pass_k)
  # No request seed: one seed is shared by every prompt of a request, so sample i of every task
  # would reuse one random stream (measured on SmolLM2: the same reply for 69 of 200 tasks'
  # first samples), correlating tasks that pass@k's bootstrap treats as independent. Unseeded
  # samples come from the engine's generator, seeded once at its construction (run.seed).
  sampling = SamplingParams(temperature=float(eval_cfg.temperature), top_p=1.0,
                            max_tokens=rollout.max_new_tokens)
  if episodes is not None:
    groups = loop.run_until_complete(episodes.groups(tasks, sampling, n))
  else:
    groups = collect_groups(generator, env, tokenizer, tasks, n, sampling)
    loop.run_until_complete(score_groups(env, groups, max_in_flight))
  ok = success_of(env)
  counts = []
  for g in groups:
    wins = [bool(ok(rw)) for rw in g.rewards]
    counts.append((n, sum(wins)))
    for i, (text, rw, w) in enumerate(zip(g.texts, g.rewards, wins)):
      records.append(dict(instance_id=str(g.task.get("instance_id", "")),
                          kind=f"sample_T{eval_cfg.temperature:g}",
                          index=i, completion=text, reward=float(rw.value), success=w,
                          malformed=bool(rw.malformed)))
  out = {"num_samples": n, "temperature": float(eval_cfg.temperature),
         "completion_len_mean": float(np.mean([len(c.token_ids) for g in groups for c in g.completions])),
         "truncated_fraction": float(np.mean([c.finish_reason == "length" for g in groups
                                              for c in g.completions]))}
  seed, resamples = int(config.run.seed), int(eval_cfg.bootstrap_resamples)
  for kk in sorted({1, k}):
    per_task = estimators.pass_at_k_per_problem(counts, kk)
    out[f"pass@{kk}"] = float(per_task.mean())
    out[f"pass@{kk}_ci95"] = list(estimators.bootstrap_ci(per_task, resamples, seed))
  out["tasks_with_a_success"] = int(sum(c > 0 for _, c in counts))
  return out


def evaluate(config, *, generator, env, tokenizer, tasks, workdir: str) -> dict:
  from dockyard.grpo.episodes import EpisodeGroups
  from dockyard.grpo.harness import run_validation
  if not tasks:
    raise ValueError("config.data.test: the test split has no tasks")
  rollout = config.rollout
  sampling = SamplingParams(temperature=rollout.val_temperature, top_p=1.0, max_tokens=rollout.max_new_tokens,
                            seed=config.run.seed)
  loop = asyncio.new_event_loop()
  samples: list[dict] = []
  sampled = None
  episodes = (EpisodeGroups(config, generator=generator, env=env, tokenizer=tokenizer)
              if "agent" in config else None)
  try:
    max_in_flight = int(config.env.code.max_in_flight)
    metrics = run_validation(generator, env, tokenizer, tasks, sampling, loop, max_in_flight, samples=samples,
                             episodes=episodes)
    for s in samples:
      s["kind"] = f"val_T{rollout.val_temperature:g}"
    if int(config.eval.pass_k) > 0:
      sampled = sampled_pass_at_k(config, generator=generator, env=env, tokenizer=tokenizer, tasks=tasks,
                                  loop=loop, max_in_flight=max_in_flight, records=samples,
                                  episodes=episodes)
    loop.run_until_complete(env.close())
  finally:
    loop.close()
  key = "val/resolve_rate" if "val/resolve_rate" in metrics else config.checkpoint.metric
  n = len(tasks)
  successes = round(metrics["val/pass@1"] * n)
  lo, hi = metrics["val/pass@1_ci95_lo"], metrics["val/pass@1_ci95_hi"]
  report = {"n": n, "metric": key.split("/", 1)[1], "rate": metrics[key],
            "pass@1": metrics["val/pass@1"], "pass@1_ci95": [lo, hi],
            "pass@1_temperature": float(rollout.val_temperature),
            "max_new_tokens": int(rollout.max_new_tokens),
            "ci95": [lo, hi], **metrics}
  if sampled is not None:
    report["sampled"] = sampled
  table = render_table(config.run.name, report, int(config.eval.pass_k))
  with open(os.path.join(workdir, TABLE), "w") as f:
    f.write(table + "\n")
  with open(os.path.join(workdir, "eval.json"), "w") as f:
    json.dump(report, f, indent=2)
  with open(os.path.join(workdir, SAMPLES), "w") as f:
    f.writelines(json.dumps(s) + "\n" for s in samples)
  print(f"eval: pass@1 (T={rollout.val_temperature:g}) = {report['pass@1']:.3f} ({successes}/{n}), "
        f"95% CI [{lo:.3f}, {hi:.3f}]", flush=True)
  if sampled is not None:
    for kk in sorted({1, int(config.eval.pass_k)}):
      clo, chi = sampled[f"pass@{kk}_ci95"]
      print(f"eval: pass@{kk} (n={sampled['num_samples']}, T={sampled['temperature']:g}) = "
            f"{sampled[f'pass@{kk}']:.3f}, 95% CI [{clo:.3f}, {chi:.3f}] (bootstrap over {n} tasks)",
            flush=True)
  print(table, flush=True)
  return report


def render_table(name: str, report: dict, pass_k: int) -> str:
  """The report as a Markdown table: one row per estimate (greedy pass@1, then the sampled ones)."""
  rows = [("pass@1", f"greedy (T={report['pass@1_temperature']:g}), 1 sample", report["pass@1"],
           report["pass@1_ci95"], "Wilson")]
  sampled = report.get("sampled")
  if sampled is not None:
    for kk in sorted({1, pass_k}):
      rows.append((f"pass@{kk}", f"{sampled['num_samples']} samples at T={sampled['temperature']:g}",
                   sampled[f"pass@{kk}"], sampled[f"pass@{kk}_ci95"], "bootstrap over tasks"))
  lines = ["| set | tasks | metric | how | value | 95% CI | interval |", "|---|---|---|---|---|---|---|"]
  for metric, how, value, (lo, hi), interval in rows:
    lines.append(f"| {name} | {report['n']} | {metric} | {how} | {value:.3f} | [{lo:.3f}, {hi:.3f}] | {interval} |")
  return "\n".join(lines)


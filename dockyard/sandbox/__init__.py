"""dockyard.sandbox: the task executor fleet that turns an agent's patch into a verdict.

  task.py       the SWE-bench task record and its validation
  integrity.py  static checks on the agent's patch; checks on what a run wrote
  cache.py      read-only (repo, base_commit) trees with a fresh single-commit .git
  isolation.py  Limits; per-run overlay views in a private mount namespace; bubblewrap runs
  executor.py   Executor.run(task) -> verdict: apply cascade, restore, canary, pytest, grading
  grading.py    per-test statuses from our pytest plugin (_plugin/), the SWE-bench rule, checks
  server.py     FastAPI executor server (:9090)      client.py  SandboxClient (httpx, failover)
  sessions.py   live agent sessions (a held view, a bwrap per command, file tools, the diff);
                session_api.py their /session routes; _session/ the in-sandbox file tools
  local.py      local_executor(): a server subprocess fleet.py   start_local_fleet(): Ray actors
  synthetic.py  a tiny synthetic repo + tasks, for tests and bench/sandbox.py
"""

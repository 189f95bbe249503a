"""The sandbox fleet: executors as Ray actors, one per placement bundle (strategy SPREAD), each
serving the executor's HTTP API on its own node.

  urls, handle = start_local_fleet(config)   # used by the launcher when sandbox_urls is empty
  ...
  handle.shutdown()

Each actor runs uvicorn in a thread with its own event loop (so the actor's method calls stay
free for `url()` / `health()`), binding 127.0.0.1 for a local fleet and the node's IP otherwise.
"""
from __future__ import annotations

import dataclasses
import threading
import time

from dockyard import ray_utils


class _ExecutorServer:
  """The body of the Ray actor (kept as a plain class so it can be tested without Ray)."""

  def __init__(self, host: str | None, port: int, slots: int, queue_size: int, limits: dict,
               repos_dir: str | None, cache_dir: str | None):
    import asyncio

    import uvicorn

    from dockyard.sandbox.executor import Executor, Limits
    from dockyard.sandbox.server import make_app
    if host is None:   # this actor's node, not the driver's
      import ray
      host = ray.util.get_node_ip_address()
    # Bound here and handed to uvicorn: two executors on one host (a simulated cluster, or a
    # taken configured port) cannot both pick a port between a free-check and uvicorn's bind.
    sock = _bind(host, port)
    self._url = f"http://{host}:{sock.getsockname()[1]}"
    self._error = None
    ready = threading.Event()

    def serve():
      try:
        asyncio.set_event_loop(asyncio.new_event_loop())
        executor = Executor(repos_dir=repos_dir, cache_dir=cache_dir, slots=slots or None,
                            limits=Limits(**limits))
        app = make_app(executor, queue_size=queue_size)
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                                     log_level="warning"))
        ready.set()
        self._server.run(sockets=[sock])
      except BaseException as e:  # surfaced by url()
        self._error = e
        ready.set()

    self._thread = threading.Thread(target=serve, daemon=True)
    self._thread.start()
    ready.wait(60)

  def url(self) -> str:
    """The server's URL once it accepts connections (raises if it failed to start)."""
    deadline = time.monotonic() + 60
    while self._error is None:
      server = getattr(self, "_server", None)
      if server is not None and server.started:
        return self._url
      if time.monotonic() > deadline:
        raise RuntimeError(f"executor at {self._url} did not start within 60 s")
      time.sleep(0.05)
    raise RuntimeError(f"executor failed to start: {self._error!r}")

  def stop(self, grace_s: float = 1.0) -> None:
    """Stops serving. Requests in flight get `grace_s` to finish; then the server exits without
    waiting for the rest (queued verdicts of a run that has ended), which cancels them: each
    running sandbox is killed by its `exec`. Without the cut, a stop after an async run waited
    for every verdict still queued (10 s, the join's limit, in bench/async_vs_sync.py)."""
    server = getattr(self, "_server", None)
    if server is not None:
      server.should_exit = True
      self._thread.join(grace_s)
      if self._thread.is_alive():
        server.force_exit = True
        self._thread.join(10)


def _bind(host: str, port: int):
  """A listening socket on `host`: `port` when it is free, else a port the OS picks."""
  import socket
  for candidate in ((port, 0) if port else (0,)):
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      sock.bind((host, candidate))
    except OSError:
      sock.close()
      if candidate == 0:
        raise
      continue
    sock.listen(2048)
    return sock


@dataclasses.dataclass
class FleetHandle:
  actors: list
  placement_group: object

  def shutdown(self) -> None:
    import ray
    from ray.util.placement_group import remove_placement_group
    for actor in self.actors:
      try:
        ray.get(actor.stop.remote(), timeout=15)
      except Exception:
        pass
      ray.kill(actor)
    self.actors = []
    if self.placement_group is not None:
      remove_placement_group(self.placement_group)
      self.placement_group = None


def start_local_fleet(config, repos_dir: str | None = None, cache_dir: str | None = None,
                      host: str | None = None) -> tuple[list[str], FleetHandle]:
  """Starts `config.sandbox.num_executors` executor actors; returns their URLs and a handle."""
  ray = ray_utils.init_ray(config.run.get("ray_address", "") if "run" in config else "")
  from ray.util.placement_group import placement_group
  from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

  from dockyard.sandbox.isolation import Limits
  sandbox = config.sandbox
  n = int(sandbox.num_executors)
  if n < 1:
    raise ValueError(f"config.sandbox.num_executors: expected >= 1, got {n}")
  slots = int(sandbox.slots)          # 0: each executor uses its node's cores
  limits = {k: v for k, v in vars(Limits.from_config(sandbox)).items()}
  local = not (config.run.get("ray_address", "") if "run" in config else "")
  # The same bundles the launcher's plan prints: the executor's own CPUs. Its sandboxes are
  # ordinary processes on that node, limited by `slots`, not by Ray.
  cpus = float(sandbox.cpus_per_executor) if sandbox.get("cpus_per_executor", 0) > 0 else max(int(sandbox.slots), 1)
  # SPREAD over the nodes; over the sandbox nodes alone where the cluster advertises fleet roles.
  bundle = ray_utils.role_bundle(ray, "sandbox", {"CPU": cpus})
  pg = placement_group([dict(bundle) for _ in range(n)], strategy="SPREAD")
  ray.get(pg.ready(), timeout=120)
  actor_cls = ray.remote(num_cpus=cpus)(_ExecutorServer)
  actors = []
  for i in range(n):
    bind = host or ("127.0.0.1" if local else None)   # None: the IP of the node the actor lands on
    actors.append(actor_cls.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
    ).remote(bind, int(sandbox.port) if not local else 0, slots, int(sandbox.queue_size), limits,
             repos_dir or sandbox.get("repos_dir") or None, cache_dir or sandbox.get("cache_dir") or None))
  handle = FleetHandle(actors, pg)
  try:
    urls = ray.get([a.url.remote() for a in actors], timeout=120)
  except BaseException:
    handle.shutdown()
    raise
  return urls, handle

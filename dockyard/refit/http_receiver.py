"""The receiving end of `HttpTransport`: a small FastAPI app next to an engine.

`POST /weights?version=N` with a safetensors body loads it into the engine (no disk);
`GET /version` reports the current weight version. `serve_in_thread` runs it under uvicorn.
"""
from __future__ import annotations

import threading
import time

import fastapi
import uvicorn


def make_app(generator) -> fastapi.FastAPI:
  app = fastapi.FastAPI(title="dockyard weight receiver")

  @app.post("/weights")
  async def weights(request: fastapi.Request, version: int):
    from safetensors.numpy import load
    body = await request.body()
    try:
      tensors = load(body)
    except Exception as e:  # a body that is not safetensors
      raise fastapi.HTTPException(400, f"body is not a safetensors blob: {e}") from None
    try:
      generator.update_weights(list(tensors.items()), version)
    except ValueError as e:
      raise fastapi.HTTPException(409, str(e)) from None
    return {"version": generator.weight_version, "tensors": len(tensors)}

  @app.get("/version")
  def current_version():
    return {"version": generator.weight_version}

  return app


def serve_in_thread(generator, host: str = "127.0.0.1", port: int = 0) -> tuple[uvicorn.Server, str]:
  """Starts the receiver on a daemon thread; returns (server, base url). `port=0` picks a free one."""
  import socket
  if port == 0:
    with socket.socket() as s:
      s.bind((host, 0))
      port = s.getsockname()[1]
  server = uvicorn.Server(uvicorn.Config(make_app(generator), host=host, port=port, log_level="warning"))
  threading.Thread(target=server.run, daemon=True).start()
  deadline = time.time() + 30
  while not server.started:
    if time.time() > deadline:
      raise RuntimeError(f"weight receiver did not start on {host}:{port}")
    time.sleep(0.05)
  return server, f"http://{host}:{port}"

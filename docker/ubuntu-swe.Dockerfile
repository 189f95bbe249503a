# The sandbox executor: dockyard's HTTP task executor (`python -m dockyard.sandbox.server`, :9090)
# with what it runs tasks with (bubblewrap, util-linux's unshare/nsenter/prlimit, git, patch) and
# Python 3.11 plus pytest for tasks without their own environment. No JAX, torch or vLLM.
#
#   docker build -f docker/ubuntu-swe.Dockerfile -t dockyard/ubuntu-swe .    # from the repo root
#
# The last step imports the server and its executor, so a broken dependency graph fails the build.
FROM ubuntu:22.04

ARG DEBIAN_FRONTEND=noninteractive
# DL3008: apt versions are not pinned: the Ubuntu archive drops superseded versions, so a pin
# breaks the build within weeks; the base image tag fixes the release. Python packages are pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv bubblewrap util-linux git patch ca-certificates \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1
RUN python3.11 -m venv /opt/venv
WORKDIR /opt/dockyard
COPY setup.py constraints.txt ./
# The executor's imports only (dockyard.sandbox.*), at constraints.txt's versions; pytest runs the
# tests of tasks that bring no environment of their own.
RUN pip install --no-cache-dir -c constraints.txt \
        pip==25.3 fastapi==0.136.3 uvicorn==0.55.0 httpx==0.29.0 tenacity==9.2.1 unidiff==1.0.1 \
        iniconfig==2.3.1 rich==15.0.0 pytest==9.2.0
COPY dockyard ./dockyard
COPY configs ./configs
COPY launch ./launch
COPY data ./data
# uid 10001: the Kubernetes pod's runAsUser (launch/k8s). The executor's isolation needs root in
# its own namespace today (docs/deployment.md), which the pod or `--container-remap-root` grants.
RUN pip install --no-cache-dir --no-deps -e . \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin dockyard
USER 10001
ENV HOME=/home/dockyard DOCKYARD_REPOS_DIR=/var/lib/dockyard/repos

# Smoke check: the server, the executor and the tools it calls. (No `pip check`: dockyard is
# installed without its trainer dependencies on purpose.)
RUN python -c "import dockyard.sandbox.server, dockyard.sandbox.executor, dockyard.sandbox.session_api, uvicorn" \
    && bwrap --version && git --version && patch --version && unshare --version && nsenter --version

EXPOSE 9090
CMD ["python", "-m", "dockyard.sandbox.server", "--host=0.0.0.0", "--port=9090"]

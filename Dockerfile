# vlrl on GPUs: the image of the Ray head, the Ray GPU workers, the RayJob submitter and `vlrl serve`.
#
#   docker build --platform linux/amd64 \
#     --build-arg VLRL_CONTAINER_IMAGE=$REPO:$TAG -t $REPO:$TAG .
#
# No model weights are baked in: models live on shared storage (/fsx/models) and are read offline.
# See docs/cluster.md for the whole path from an empty EKS cluster to a served adapter.

# CUDA 13.0 runtime on Ubuntu 24.04 (Python 3.12). The PyPI wheels of torch 2.11.0 are CUDA 13.0
# builds that bring their own cuBLAS, cuDNN and NCCL, so a cuDNN base image would only add a second
# copy. Nodes need an NVIDIA driver that supports CUDA 13 (R580 or newer).
FROM nvidia/cuda:13.0.2-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive
# wget + grep: KubeRay's default liveness/readiness probes run `wget ... | grep success` in the Ray
# containers. gcc/g++/python3.12-dev: Triton and torch.compile build small C stubs at run time.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3.12 python3.12-venv python3.12-dev gcc g++ \
      wget ca-certificates procps \
 && rm -rf /var/lib/apt/lists/*

# Ubuntu 24.04 images ship a user `ubuntu` with uid 1000; replace it by `vlrl` with the same uid so
# the manifests' runAsUser 1000 owns what it writes on /fsx.
RUN (userdel --remove ubuntu 2>/dev/null || true) \
 && (groupdel ubuntu 2>/dev/null || true) \
 && groupadd --gid 1000 vlrl \
 && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash vlrl

# One virtual environment (Ubuntu's system Python refuses pip installs, PEP 668). KubeRay starts Ray
# through a login shell (`bash -lc`), so profile.d puts the venv first there too.
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3.12 -m venv /opt/venv \
 && pip install --no-cache-dir --upgrade pip \
 && echo 'export PATH=/opt/venv/bin:$PATH' > /etc/profile.d/vlrl-venv.sh

# The heavy pinned stack in its own layer, rebuilt only when a pin changes. The (torch, vLLM) pair
# is one that has run on an H200 with vlrl's engine checks (bench/gpu_vllm.sh, bench/RESULTS.md):
# vLLM 0.24.0 requires exactly torch 2.11.0 (CUDA 13). vlrl supports vLLM 0.24 through 0.32
# (src/vlrl/rollout/vllm_compat.py); moving to another version means re-running those checks. The
# constraints file keeps the project install below from moving any of the three.
RUN printf '%s\n' torch==2.11.0 vllm==0.24.0 ray==2.60.0 > /opt/vlrl-constraints.txt \
 && pip install --no-cache-dir -c /opt/vlrl-constraints.txt \
      torch==2.11.0 vllm==0.24.0 "ray[default]==2.60.0"

# The project itself (non-editable). configs/ stays in the image for reference and quick tests.
WORKDIR /opt/vlrl
COPY pyproject.toml README.md ./
COPY src ./src
COPY configs ./configs
RUN pip install --no-cache-dir -c /opt/vlrl-constraints.txt ".[ray,tracking,metrics,serve]" \
 && vlrl --help > /dev/null \
 && python -c "import ray, torch; assert ray.__version__ == '2.60.0', ray.__version__; assert torch.__version__.startswith('2.11.0'), torch.__version__"

# Offline by design: the cluster never downloads from a model hub; no usage telemetry either.
# VLLM_USE_FLASHINFER_SAMPLER=0: this runtime image has no nvcc for FlashInfer's JIT sampler kernels.
ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HUB_DISABLE_TELEMETRY=1 \
    VLLM_NO_USAGE_STATS=1 \
    RAY_USAGE_STATS_ENABLED=0 \
    DO_NOT_TRACK=1 \
    PYTHONUNBUFFERED=1 \
    VLLM_USE_FLASHINFER_SAMPLER=0

# Last, so a new image name does not rebuild the layers above. Run lineage (vlrl.tracking.lineage)
# records both: the image, and the commit it was built from (the image holds no git checkout).
ARG VLRL_CONTAINER_IMAGE=vlrl:dev
ARG VLRL_GIT_COMMIT=unknown
ENV VLRL_CONTAINER_IMAGE=${VLRL_CONTAINER_IMAGE} \
    VLRL_GIT_COMMIT=${VLRL_GIT_COMMIT}
LABEL org.opencontainers.image.title="vlrl" \
      org.opencontainers.image.description="GRPO + LoRA post-training of vision-language models on Ray" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${VLRL_GIT_COMMIT}"

RUN mkdir -p /workspace && chown 1000:1000 /workspace
USER 1000:1000
WORKDIR /workspace
CMD ["vlrl", "--help"]

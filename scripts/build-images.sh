#!/usr/bin/env bash
# Build the llmmesh images with podman and prove they run.
#
#   scripts/build-images.sh [--smoke] [TARGET ...]     TARGET: mesh (default), cpu, cuda
#
# Installs podman (apt) when it is missing. The Dockerfile's bases come from
# the registry when it answers; when it does not, they are built here from
# Debian packages: a minbase bookworm root file system (debootstrap) imported
# as localhost/debian:bookworm, and on it a Python 3.11 base and a Node.js
# base (Debian's nodejs 18 and npm; Vite 6 supports Node 18), passed to the
# build as PYTHON_IMAGE and NODE_IMAGE. Builds use chroot isolation (no user
# namespaces needed), the docker image format and layer caching; images are
# tagged llmmesh:<target> and stay in podman's store.
#
# --smoke runs each built image as the image's user (uid 10001):
#   mesh: `llmmesh up --engine sim`, one streamed chat completion through the
#         edge's published port, then SIGTERM: the mesh drains and exits 0;
#   cpu:  one vLLM engine pod on the model baked into the image, until it is
#         serving, then SIGTERM: it drains and exits 0.
#
# Environment:
#   PIP_EXTRA_INDEX_URL  index with torch's CPU wheels for the cpu target
#                        (default https://download.pytorch.org/whl/cpu)
#   LLMMESH_WHEELS_DIR   instead: a directory of wheels (torch's CPU wheel)
#                        served to the cpu build on a loopback port
#   EXTRA_CA_CERTS       PEM text of a CA that re-signs outbound TLS (a proxy's),
#                        passed to the build (pip, npm)
#   DEBIAN_MIRROR        mirror for the local bases (default http://deb.debian.org/debian)
#   LLMMESH_SMOKE_PORT   host port the mesh's edge is published on (default: a free one)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON_IMAGE="${PYTHON_IMAGE:-python:3.11-slim-bookworm}"
NODE_IMAGE="${NODE_IMAGE:-node:20-bookworm-slim}"
LOCAL_DEBIAN="localhost/debian:bookworm"
LOCAL_PYTHON="localhost/python:3.11-bookworm"
LOCAL_NODE="localhost/node:18-bookworm"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SMOKE_PORT="${LLMMESH_SMOKE_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
BUILD=(podman build --isolation chroot --format docker --layers)

say() { printf '[build-images %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { say "error: $*"; exit 1; }

ensure_podman() {
    command -v podman >/dev/null && return
    say "installing podman (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends podman >/dev/null
}

# A base image: the registry's when it can be pulled, else $3 built by $4.
resolve_base() {
    local wanted="$1" local_tag="$2" builder="$3"
    if podman image exists "$wanted" || timeout 120 podman pull --quiet "$wanted" >/dev/null 2>&1; then
        say "base $wanted: from the registry"
        printf '%s\n' "$wanted"
        return
    fi
    if ! podman image exists "$local_tag"; then
        say "base $wanted cannot be pulled: building $local_tag from Debian packages"
        "$builder"
    fi
    say "base $wanted: using $local_tag"
    printf '%s\n' "$local_tag"
}

build_debian() {
    podman image exists "$LOCAL_DEBIAN" && return
    command -v debootstrap >/dev/null || {
        say "installing debootstrap (apt)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap >/dev/null
    }
    local rootfs
    rootfs="$(mktemp -d /tmp/llmmesh-rootfs.XXXXXX)"
    say "debootstrap --variant=minbase bookworm into $rootfs"
    debootstrap --variant=minbase bookworm "$rootfs" "$DEBIAN_MIRROR" >/dev/null
    cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $DEBIAN_MIRROR bookworm main
deb $DEBIAN_MIRROR bookworm-updates main
deb ${DEBIAN_MIRROR%/debian}/debian-security bookworm-security main
EOF
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
    say "importing $rootfs as $LOCAL_DEBIAN"
    tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$LOCAL_DEBIAN" >/dev/null
    rm -rf "$rootfs"
}

# A base built from a Containerfile on stdin, FROM the local Debian.
build_on_debian() {
    local tag="$1" context
    build_debian
    context="$(mktemp -d /tmp/llmmesh-base.XXXXXX)"
    cat >"$context/Containerfile"
    "${BUILD[@]}" --quiet --tag "$tag" "$context" >/dev/null
    rm -rf "$context"
}

build_python() {
    build_on_debian "$LOCAL_PYTHON" <<EOF
FROM $LOCAL_DEBIAN
RUN apt-get update \\
    && apt-get install -y --no-install-recommends python3.11 python3-venv python3-pip python-is-python3 ca-certificates \\
    && rm -rf /var/lib/apt/lists/*
CMD ["python3"]
EOF
}

build_node() {
    build_on_debian "$LOCAL_NODE" <<EOF
FROM $LOCAL_DEBIAN
RUN apt-get update \\
    && apt-get install -y --no-install-recommends nodejs npm ca-certificates \\
    && rm -rf /var/lib/apt/lists/*
CMD ["node"]
EOF
}

# Serves LLMMESH_WHEELS_DIR as a simple index on a loopback port (chroot
# isolation shares the host's network) at WHEEL_URL.
WHEEL_SERVER_PID=""
WHEEL_INDEX=""
WHEEL_URL=""
serve_wheels() {
    local dir="$1" port wheel name
    WHEEL_INDEX="$(mktemp -d /tmp/llmmesh-wheels.XXXXXX)"
    for wheel in "$dir"/*.whl; do
        name="$(basename "$wheel" | cut -d- -f1 | tr '_.' '--' | tr '[:upper:]' '[:lower:]')"
        mkdir -p "$WHEEL_INDEX/simple/$name"
        ln -s "$(realpath "$wheel")" "$WHEEL_INDEX/simple/$name/"
    done
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    python3 -m http.server --bind 127.0.0.1 --directory "$WHEEL_INDEX" "$port" >/dev/null 2>&1 &
    WHEEL_SERVER_PID=$!
    WHEEL_URL="http://127.0.0.1:$port/simple/"
    for _ in $(seq 20); do
        curl -fsS -o /dev/null "$WHEEL_URL" 2>/dev/null && return
        sleep 0.5
    done
    die "the wheel index at $WHEEL_URL did not answer"
}

build_target() {
    local target="$1" python_base="$2" node_base="$3" started
    local args=(--build-arg "PYTHON_IMAGE=$python_base" --build-arg "NODE_IMAGE=$node_base")
    [ -z "${EXTRA_CA_CERTS:-}" ] || args+=(--build-arg "EXTRA_CA_CERTS=$EXTRA_CA_CERTS")
    if [ "$target" = cpu ]; then
        local index="${PIP_EXTRA_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
        if [ -n "${LLMMESH_WHEELS_DIR:-}" ]; then
            serve_wheels "$LLMMESH_WHEELS_DIR"
            index="$WHEEL_URL"
            say "serving $LLMMESH_WHEELS_DIR to the build at $index"
        fi
        args+=(--build-arg "PIP_EXTRA_INDEX_URL=$index")
    fi
    say "building llmmesh:$target"
    started=$SECONDS
    "${BUILD[@]}" --target "$target" --tag "llmmesh:$target" "${args[@]}" "$ROOT"
    say "built llmmesh:$target in $((SECONDS - started)) s, $(image_size "llmmesh:$target")"
}

image_size() {
    podman image inspect --format '{{.Size}}' "$1" | awk '{ printf "%.2f GB", $1 / 1e9 }'
}

# How containers are run: podman's defaults where they work; else within
# this host's resource limits (a runtime that may not raise RLIMIT_NOFILE or
# RLIMIT_NPROC fails to start one otherwise), and on runc where crun refuses
# the host's cgroups (a v1/v2 hybrid with controllers on v2).
RUN=(podman run)
choose_runtime() {
    local image="$1" limits
    limits=(--ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit "nproc=32768:32768")
    for candidate in "podman run" "podman run ${limits[*]}" "podman --runtime runc run ${limits[*]}"; do
        if [[ "$candidate" == *runc* ]] && ! command -v runc >/dev/null; then
            say "installing runc (apt)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends runc >/dev/null
        fi
        read -r -a RUN <<<"$candidate"
        if "${RUN[@]}" --rm --entrypoint true "$image" >/dev/null 2>&1; then
            say "containers run with: ${RUN[*]}"
            return
        fi
    done
    "${RUN[@]}" --rm --entrypoint true "$image" || die "no container starts on this host"
}

# SIGTERM to a container's init; waits for it to exit and checks the status.
stop_and_check_drain() {
    local name="$1" status
    say "$name: SIGTERM"
    podman kill --signal TERM "$name" >/dev/null
    status="$(timeout 120 podman wait "$name")" || die "$name did not exit within 120 s of SIGTERM"
    podman logs "$name" 2>&1 | tail -n 5 | sed "s/^/    $name| /" >&2
    podman rm "$name" >/dev/null
    [ "$status" = 0 ] || die "$name exited $status after SIGTERM (expected 0)"
    say "$name: drained, exit status 0"
}

smoke_uid() {
    local uid
    uid="$("${RUN[@]}" --rm --entrypoint id "llmmesh:$1" -u)"
    [ "$uid" = 10001 ] || die "llmmesh:$1 runs as uid $uid, not 10001"
    say "llmmesh:$1 runs as uid $uid"
}

smoke_mesh() {
    local name="llmmesh-smoke-mesh" url="http://127.0.0.1:$SMOKE_PORT" body
    smoke_uid mesh
    podman rm -f "$name" >/dev/null 2>&1 || true
    say "mesh: llmmesh up --engine sim, edge published on $url"
    "${RUN[@]}" -d --name "$name" --user 10001 -p "127.0.0.1:$SMOKE_PORT:8080" llmmesh:mesh \
        up --engine sim --host 0.0.0.0 --advertise-host 127.0.0.1 --edge-port 8080 --redis none >/dev/null
    # `llmmesh up` writes mesh.json once every region serves.
    for _ in $(seq 180); do
        podman exec "$name" test -s /var/lib/llmmesh/mesh.json 2>/dev/null && break
        [ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] \
            || { podman logs "$name" >&2; podman rm "$name" >/dev/null; die "the mesh exited while starting"; }
        sleep 1
    done
    podman exec "$name" test -s /var/lib/llmmesh/mesh.json || die "the mesh was not serving within 180 s"
    curl -fsS -o /dev/null "$url/healthz" || die "the edge does not answer on $url"
    body="$(curl -fsSN --max-time 60 "$url/v1/chat/completions" \
        -H 'authorization: Bearer sk-llmmesh-dev' -H 'content-type: application/json' \
        -d '{"model": "auto", "stream": true, "max_tokens": 16, "messages": [{"role": "user", "content": "Hello!"}]}')" \
        || { podman logs "$name" 2>&1 | tail -n 30 >&2; die "the streamed chat completion failed"; }
    local chunks
    chunks="$(grep -c '"content":"[^"]' <<<"$body" || true)"
    grep -q '^data: \[DONE\]' <<<"$body" || die "the stream did not end with [DONE]: $body"
    [ "$chunks" -gt 0 ] || die "the stream carried no tokens: $body"
    say "mesh: streamed $chunks content chunks through the edge, then [DONE]"
    stop_and_check_drain "$name"
}

smoke_cpu() {
    local name="llmmesh-smoke-cpu"
    smoke_uid cpu
    # The build writes the models as root; the engine reads them as 10001.
    local unreadable
    unreadable="$("${RUN[@]}" --rm --user 10001 --entrypoint find llmmesh:cpu /opt/llmmesh-models ! -readable)"
    [ -z "$unreadable" ] || die "uid 10001 cannot read: $unreadable"
    say "cpu: every file of /opt/llmmesh-models is readable by uid 10001"
    podman rm -f "$name" >/dev/null 2>&1 || true
    say "cpu: a vLLM engine pod on the baked model, as uid 10001"
    # vLLM's engine core and its worker share a ring buffer in /dev/shm
    # (160 MiB here): podman's default 64 MiB is too small; the chart gives 2Gi.
    "${RUN[@]}" -d --name "$name" --user 10001 --network none --shm-size 2g llmmesh:cpu \
        engine --backend vllm --insecure --host 127.0.0.1 --port 50061 \
        --ready-file /tmp/engine-ready.json >/dev/null
    for _ in $(seq 600); do
        podman exec "$name" test -s /tmp/engine-ready.json 2>/dev/null && break
        [ "$(podman inspect --format '{{.State.Running}}' "$name")" = true ] \
            || { podman logs "$name" 2>&1 | grep -E 'Error|error' | tail -n 10 >&2; podman rm "$name" >/dev/null; die "the engine exited while loading"; }
        sleep 1
    done
    podman exec "$name" test -s /tmp/engine-ready.json || die "the engine was not serving within 600 s"
    say "cpu: engine serving the model at $(podman exec "$name" printenv LLMMESH_MODEL_PATH)"
    stop_and_check_drain "$name"
}

cleanup() {
    [ -n "$WHEEL_SERVER_PID" ] && kill "$WHEEL_SERVER_PID" 2>/dev/null || true
    [ -n "$WHEEL_INDEX" ] && rm -rf "$WHEEL_INDEX"
    podman rm -f llmmesh-smoke-mesh llmmesh-smoke-cpu >/dev/null 2>&1 || true
}

main() {
    local smoke=0 targets=() target
    for arg in "$@"; do
        case "$arg" in
            --smoke) smoke=1 ;;
            mesh | cpu | cuda) targets+=("$arg") ;;
            -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
            *) die "unknown argument $arg (targets: mesh, cpu, cuda; option --smoke)" ;;
        esac
    done
    [ "${#targets[@]}" -gt 0 ] || targets=(mesh)
    trap cleanup EXIT
    ensure_podman
    say "podman $(podman version --format '{{.Client.Version}}'); free disk: $(df -h --output=avail /var/lib/containers 2>/dev/null | tail -n 1 | tr -d ' ')"
    local python_base node_base
    python_base="$(resolve_base "$PYTHON_IMAGE" "$LOCAL_PYTHON" build_python)"
    node_base="$(resolve_base "$NODE_IMAGE" "$LOCAL_NODE" build_node)"
    for target in "${targets[@]}"; do
        build_target "$target" "$python_base" "$node_base"
        if [ "$smoke" = 1 ]; then
            choose_runtime "llmmesh:$target"
            case "$target" in
                mesh) smoke_mesh ;;
                cpu) smoke_cpu ;;
                cuda) smoke_uid cuda ;;
            esac
        fi
    done
    say "done: $(for t in "${targets[@]}"; do printf 'llmmesh:%s %s; ' "$t" "$(image_size "llmmesh:$t")"; done)"
}

main "$@"

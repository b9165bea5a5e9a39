#!/usr/bin/env bash
# Sets up hostir for development and tests in the current python3 environment (no venv).
#
# Idempotent: safe to run again. Steps:
#   1. torch, if `import torch` fails. On a machine without a GPU the CPU build
#      is pinned (torch==2.13.0, found through the machine's pip config): an
#      unpinned `torch` would pull gigabytes of CUDA packages. With a GPU, the
#      default (CUDA) build.
#   2. hostir itself, editable, with the test extras.
#   3. graphviz's `dot` (for `hostir viz`), through apt-get when we are root.
set -euo pipefail
trap 'echo "setup.sh: error: command failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

cd "$(dirname "${BASH_SOURCE[0]}")/.."  # the repository root, whatever the caller's cwd

has_gpu() {
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

if python3 -c "import torch" >/dev/null 2>&1; then
    echo "setup.sh: torch $(python3 -c 'import torch; print(torch.__version__)') already installed"
elif has_gpu; then
    echo "setup.sh: installing torch (GPU found)"
    python3 -m pip install torch
else
    echo "setup.sh: installing the CPU build of torch (no GPU found)"
    python3 -m pip install "torch==2.13.0"
fi

echo "setup.sh: installing hostir (editable, with test extras)"
python3 -m pip install -e ".[test]"

if command -v dot >/dev/null 2>&1; then
    :
elif [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup.sh: installing graphviz"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y graphviz
else
    echo "setup.sh: warning: graphviz's 'dot' is missing and cannot be installed here" \
        "(not root, or no apt-get); 'hostir viz' will not render" >&2
fi

echo "setup.sh: done"

#!/usr/bin/env bash
# Create .venv/ and install normplug with torch (CPU build unless an NVIDIA GPU is present),
# the fairseq that imports on this Python, and the runtime and test requirements. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
STAMP=$VENV/.normplug-setup
want=$(cat setup.py requirements.txt requirements-test.txt scripts/setup-env.sh | sha256sum | cut -c1-16)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
    echo "setup: $VENV is up to date"; exit 0
fi
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 8))' ||
    { echo "setup: $PYTHON is older than Python 3.8; set PYTHON=/path/to/python3.8+" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
py=$VENV/bin/python
pip() { "$py" -m pip --disable-pip-version-check "$@"; }

# 1. torch, never picked by a dependency (an unpinned PyPI torch is a multi-GB CUDA build):
# CUDA with an NVIDIA driver, else a local CPU wheel, else PyTorch's CPU index (+cpu).
if ! "$py" -c 'import torch' 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "setup: NVIDIA GPU found, installing torch==$TORCH_VERSION (CUDA build)"
        pip install "torch==$TORCH_VERSION"
    elif pip install -q --no-index --no-deps "torch==$TORCH_VERSION" 2>/dev/null \
            && "$py" -c 'import importlib.metadata as m, sys; sys.exit("+cpu" not in m.version("torch"))'; then
        echo "setup: no GPU, using the local CPU wheel of torch==$TORCH_VERSION"
        pip install -q "torch==$TORCH_VERSION"  # its dependencies, from the registry
    else
        echo "setup: no GPU, installing torch==$TORCH_VERSION+cpu from PyTorch's CPU index"
        "$py" -m pip uninstall -q -y torch 2>/dev/null || true
        pip install "torch==$TORCH_VERSION+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
    fi
fi

# 2. runtime and test requirements (triton, ~1 GB, for the fused norms' tests on the CPU).
pip install -q -r requirements.txt -r requirements-test.txt

# 3. fairseq: the maintained fork on 3.11+, the official release below (its dependencies: setup.py's fairseq extra).
fairseq_req=fairseq==0.12.2
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' && fairseq_req=fairseq-fixed==0.12.3.1
if ! "$py" -c 'import fairseq' 2>/dev/null; then
    echo "setup: installing $fairseq_req (compiles its extensions once per machine, ~6 min on 2 cores)"
    # --no-build-isolation: its build imports torch; --no-deps: it declares torchaudio.
    pip install -q --no-deps --no-build-isolation "$fairseq_req"
fi

# 4. normplug, editable, so `--user-dir normplug` and the console scripts see the working tree; with what
# setup.py declares for it and for fairseq (the README's own-environment route), which the pins above satisfy.
pip install -q --no-build-isolation -e ".[fairseq]"

"$py" -c 'import torch, fairseq, normplug; print("setup: torch", torch.__version__, "| fairseq", fairseq.__version__, "| normplug", normplug.__version__)'

echo "$want" > "$STAMP"

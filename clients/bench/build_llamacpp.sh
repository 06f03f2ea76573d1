#!/usr/bin/env bash
# Builds llama.cpp's `llama-server`, `llama-quantize`, `llama-perplexity` and
# `llama-tokenize` for gyre-bench's L1 (gyre vs llama.cpp on the same GGUF
# files: speed, and perplexity on a fixed text), once per version.
#
# Usage: clients/bench/build_llamacpp.sh PYTHON VERSION DEST
#
# The sources are the llama.cpp copy vendored in llama-cpp-python's source
# distribution (vendor/llama.cpp) of that VERSION, fetched with PYTHON's pip from the Python
# package registry (`pip download --no-binary`), so a machine that reaches
# only the package registries can build it. cmake comes from PATH, else it is
# installed into PYTHON's environment with pip. The build is CPU only, tuned
# for this machine (GGML_NATIVE), without HTTPS, the web UI or tests, on two
# jobs. DEST gets src/ (the unpacked sources, kept for convert_hf_to_gguf.py
# and its gguf-py), build/, bin/ with the four tools, and a .built stamp
# naming the CPU it was built for (model name and a hash of its feature
# flags): a re-run with every tool present and the stamp naming this CPU
# exits at once, one on another CPU (a cache directory shared by machines, or
# carried to a new one) rebuilds from a clean build/, so that llama.cpp always
# runs with this machine's flags (a build of an older version of this script
# gains the tools it lacks). The converter
# imports sentencepiece, which gyre's environment lacks: it is installed into
# PYTHON's environment here.
set -euo pipefail

CMAKE_VERSION=3.31.10
SENTENCEPIECE_VERSION=0.2.1
usage="usage: build_llamacpp.sh PYTHON VERSION DEST"
PY=${1:?$usage}
LLAMA_CPP_PYTHON_VERSION=${2:?$usage}
DEST=${3:?$usage}

TOOLS="llama-server llama-quantize llama-perplexity llama-tokenize"
have_all=1
for t in $TOOLS; do [ -x "$DEST/bin/$t" ] || have_all=0; done
cpu="$(uname -m)"
if [ -r /proc/cpuinfo ]; then
  cpu="$cpu $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  cpu="$cpu flags:$(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2- | tr ' ' '\n' | sort | tr -d '\n' | cksum | cut -d' ' -f1)"
fi
if [ -f "$DEST/.built" ] && [ $have_all = 1 ] && [ "$(cat "$DEST/.built")" = "$cpu" ]; then
  exit 0
fi
if [ -f "$DEST/.built" ] && [ "$(cat "$DEST/.built")" != "$cpu" ]; then
  echo "build_llamacpp.sh: built for '$(cat "$DEST/.built")', this CPU is '$cpu': rebuilding" >&2
  rm -rf "$DEST/build" "$DEST/bin" "$DEST/.built"
fi
mkdir -p "$DEST/download"
sdist="$DEST/download/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  # --no-binary for this package only: its build requirements may come as
  # wheels (pip prepares the sdist's metadata with them).
  "$PY" -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$DEST/download"
fi
if [ ! -f "$DEST/src/CMakeLists.txt" ]; then
  rm -rf "$DEST/src" "$DEST/src.tmp"
  mkdir -p "$DEST/src.tmp"
  tar xzf "$sdist" -C "$DEST/src.tmp" --strip-components=3 \
    "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
  mv "$DEST/src.tmp" "$DEST/src"
fi

cmake=$(command -v cmake || true)
if [ -z "$cmake" ]; then
  "$PY" -m pip install -q --disable-pip-version-check "cmake==$CMAKE_VERSION"
  cmake="$(dirname "$PY")/cmake"
fi
"$cmake" -S "$DEST/src" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
"$cmake" --build "$DEST/build" --config Release -j 2 --target $TOOLS
mkdir -p "$DEST/bin"
for t in $TOOLS; do cp "$DEST/build/bin/$t" "$DEST/bin/"; done
"$PY" -c 'import sentencepiece' 2>/dev/null ||
  "$PY" -m pip install -q --disable-pip-version-check "sentencepiece==$SENTENCEPIECE_VERSION"
printf '%s\n' "$cpu" > "$DEST/.built"

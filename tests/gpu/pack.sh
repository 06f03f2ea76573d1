#!/usr/bin/env bash
# Packs what tests/gpu/device.sh needs on a GPU machine into .device/
# (git-ignored): the stripped release binaries (built against the pinned
# torch, the version the GPU machines carry), the gguf wheel, the tiny test
# families' configs (weights are drawn there), and optionally one part of a
# file too large for one transfer.
#
#     bash tests/gpu/pack.sh [FILE PART_MIB INDEX]
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${CARGO_TARGET_DIR:-$HOME/.cache/gyre/target}/release
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
grep -qx "/.device/" "$ex" 2>/dev/null || echo "/.device/" >> "$ex"
rm -rf .device && mkdir -p .device/families .device/whl .device/parts
tar -C "$T" -cf - gyre gyre-bench examples/greedy examples/steptime examples/cuda_check \
  | xz -6 -T2 > .device/bins.tar.xz
sha256sum < .device/bins.tar.xz | cut -d' ' -f1 > .device/bins.sha256
${PYTHON:-${GYRE_CACHE:-$HOME/.cache/gyre}/venv/bin/python} -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 -d .device/whl gguf==0.19.0
for f in tiny-llama tiny-qwen3 tiny-gemma3 tiny-gemma2 tiny-phi3 tiny-mistral-sw; do
  mkdir -p .device/families/$f
  cp .gyre/models/$f/config.json .gyre/models/$f/generation_config.json .device/families/$f/
done
if [ $# -eq 3 ]; then
  file=$1 mib=$2 idx=$3 name=$(basename "$1")
  sha256sum < "$file" | cut -d' ' -f1 > .device/parts/$name.sha256
  dd if="$file" of=.device/parts/$name.$idx bs=1M skip=$((mib * idx)) count="$mib" status=none
fi
du -sh .device

#!/usr/bin/env bash
# Runs gyre's GPU checks on a machine with an NVIDIA GPU, its own PyTorch and
# transformers, and no Rust toolchain (see the README's "GPU" section).
# Binaries are built elsewhere against the same torch and packed by
# tests/gpu/pack.sh into .device/ (git-ignored).
#
#     bash tests/gpu/device.sh STEP...
#
# Steps: env, cuda-check, fidelity-tiny, fidelity-shapes, fidelity-gguf,
# shapes, decode, decode-fused, pdl, unroll, gemv-split, gemv-silu,
# gemv-ab, attn-ab, stages, kernels, profile, serve-smoke, bench,
# bench-sweep. Results go under $OUT (default /tmp/gyre-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gyre-out}
mkdir -p "$OUT"
TORCH_DIR=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')
export LD_LIBRARY_PATH=$TORCH_DIR/lib:$TORCH_DIR/../nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
B=/tmp/gyre-bin
KEEP=/tmp/gyre-keep
W=/tmp/gyre-fidelity
mkdir -p "$KEEP"
if [ -f .device/bins.tar.xz ] && ! cmp -s .device/bins.sha256 $B/.from 2>/dev/null; then
  rm -rf $B && mkdir -p $B
  python3 -c 'import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .device/bins.tar.xz $B
  cp .device/bins.sha256 $B/.from
fi
if ls .device/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl
fi
export PYTHONPATH=/tmp/site
# Parts of a file too large for one transfer: .device/parts/NAME.N collect in
# $KEEP until NAME.sha256 matches their concatenation.
for d in .device/parts .gpart*; do
  ls "$d"/* >/dev/null 2>&1 && cp "$d"/* "$KEEP"/
done
for sum in "$KEEP"/*.sha256; do
  [ -e "$sum" ] || continue
  name=$(basename "$sum" .sha256)
  [ -f "$KEEP/$name" ] && continue
  cat $(ls "$KEEP"/"$name".[0-9]* 2>/dev/null | sort -V) > "$KEEP/$name.tmp" 2>/dev/null
  if [ "$(sha256sum < "$KEEP/$name.tmp" | cut -d' ' -f1)" = "$(cat "$sum")" ]; then
    mv "$KEEP/$name.tmp" "$KEEP/$name" && echo "assembled $name"
  else
    rm -f "$KEEP/$name.tmp"; echo "parts of $name: $(ls "$KEEP"/"$name".[0-9]* | wc -l) so far"
  fi
done

step_env() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch,transformers;print("torch",torch.__version__,"transformers",transformers.__version__)'
  ldd $B/gyre | grep -E 'torch|c10|not found'
  python3 tests/gpu/bandwidth.py | tee "$OUT/bandwidth.json"
}

step_cuda_check() {
  for m in ${CUDA_CHECK_MODELS:-"$W"/tiny-*}; do
    echo "== cuda_check $(basename "$m")"
    GYRE_FUSED_NORM=0 $B/examples/cuda_check "$m" 2>&1 | grep -v '^\s*$' | tail -40
  done 2>&1 | tee -a "$OUT/cuda_check.txt"
}

step_fidelity_tiny() {
  local args=()
  for f in .device/families/*/; do args+=(--family "$f"); done
  python3 tests/gpu/fidelity.py --greedy-bin $B/examples/greedy --out "$OUT/fidelity-tiny.json" \
    --keep --workdir "$W" "${args[@]}" 2>&1 | grep -v "Writing model shards" | tee "$OUT/fidelity-tiny.txt"
}

step_fidelity_shapes() {
  python3 tests/gpu/fidelity.py --greedy-bin $B/examples/greedy --out "$OUT/fidelity-shapes.json" \
    --keep --workdir "$W" --shape llama-3.2-1b --shape llama-3-8b 2>&1 \
    | grep -v "Writing model shards" | tee "$OUT/fidelity-shapes.txt"
}

step_shapes() {
  python3 tests/gpu/fidelity.py --greedy-bin $B/examples/greedy --out "$OUT/shapes.json" --build-only \
    --workdir "$W" --shape llama-3.2-1b --shape llama-3-8b 2>&1 | grep -v "Writing model shards"
}

step_fidelity_gguf() {
  python3 tests/gpu/fidelity.py --greedy-bin $B/examples/greedy --out "$OUT/fidelity-gguf.json" \
    --gguf "$KEEP/smollm2-135m-instruct.gguf" 2>&1 | tee "$OUT/fidelity-gguf.txt"
}

# One steptime run: MODEL STREAMS PROMPT [VAR=VALUE...], 256 new tokens,
# CUDA graphs on, each graph's replay time logged (GYRE_PROFILE_GRAPHS).
steptime_run() {
  local m=$1 streams=$2 prompt=$3; shift 3
  echo "== steptime $(basename "$m") streams=$streams prompt=$prompt $*"
  env "$@" DEVICE=cuda ROUNDS=2 GYRE_PROFILE_GRAPHS=1 timeout 150 \
    $B/examples/steptime "$m" "$prompt" 256 "$streams" 2>&1 | grep -E "round 1|replayed|rror|panic|WARN" | cut -c1-220
}

step_decode() {
  # Batch-1 and 8-stream decode on each random-weight shape (CUDA graphs
  # on), the graphs' own device time per replay (GYRE_PROFILE_GRAPHS), then
  # the same with sampling on the host (GYRE_DEVICE_SAMPLING=0) and with
  # the unfused RMSNorm (GYRE_FUSED_NORM=0); greedy, and sampled
  # (temperature 1, top-p 0.9) on the device and on the host. Then the
  # roofline of each shape.
  for name in ${DECODE_MODELS:-llama-3-8b llama-3.2-1b}; do
    local m="$W/$name"
    [ -d "$m" ] || continue
    steptime_run "$m" 1 128 X=1
    steptime_run "$m" 8 128 X=1
    if [ "$name" = llama-3-8b ]; then
      steptime_run "$m" 1 128 GYRE_DEVICE_SAMPLING=0
      steptime_run "$m" 1 128 GYRE_FUSED_NORM=0
      steptime_run "$m" 1 128 TEMP=1
      steptime_run "$m" 1 128 TEMP=1 GYRE_DEVICE_SAMPLING=0
    fi
    python3 tests/gpu/roofline.py "$m" "$OUT/bandwidth.json" 256
  done 2>&1 | tee -a "$OUT/decode.txt"
}

step_decode_fused() {
  # gyre's fused kernels (engine/src/fused.rs) on, and off
  # (GYRE_FUSED_KERNELS=0), and on the 8B without the matrix-vector kernel
  # (GYRE_GEMV=0) or the decode attention kernel (GYRE_DECODE_ATTN=0).
  # Batch 1 on each shape, 8 streams (the kernel up to 4 rows, and 8) and
  # a 2,000-token context on the 8B;
  # CUDA graphs on, graph replay times profiled; then the rooflines.
  for name in ${DECODE_MODELS:-llama-3-8b llama-3.2-1b}; do
    local m="$W/$name"
    [ -d "$m" ] || continue
    steptime_run "$m" 1 128 X=1
    if [ "$name" = llama-3-8b ]; then
      steptime_run "$m" 1 128 GYRE_GEMV=0
      steptime_run "$m" 1 128 GYRE_DECODE_ATTN=0
    fi
    steptime_run "$m" 1 128 GYRE_FUSED_KERNELS=0
    if [ "$name" = llama-3-8b ]; then
      steptime_run "$m" 8 128 X=1
      steptime_run "$m" 8 128 GYRE_GEMV_MAX_ROWS=8
      steptime_run "$m" 8 128 GYRE_FUSED_KERNELS=0
      steptime_run "$m" 1 2000 X=1
      steptime_run "$m" 1 2000 GYRE_DECODE_ATTN=0
    fi
    python3 tests/gpu/roofline.py "$m" "$OUT/bandwidth.json" 256
  done 2>&1 | tee -a "$OUT/decode.txt"
}

step_pdl() {
  # Programmatic dependent launch of gyre's kernels on (the default) and
  # off (GYRE_PDL=0), alternating, CUDA graphs on: batch 1 and 8 streams on
  # the 8B shape, batch 1 on the 1B, and a 2,000-token context on the 8B.
  # Then greedy tokens and top-2 logprobs with it on and off (one prompt,
  # so the matrix-vector kernel runs, and four), which must be identical:
  # it moves no arithmetic.
  pdl_runs 2>&1 | tee -a "$OUT/pdl.txt"
}

pdl_runs() {
  local m8="$W/llama-3-8b" m1="$W/llama-3.2-1b"
  for rep in 1 2; do
    for e in GYRE_PDL=0 GYRE_PDL=1; do steptime_run "$m8" 1 128 $e; done
  done
  for e in GYRE_PDL=0 GYRE_PDL=1; do steptime_run "$m8" 8 128 $e; done
  for e in GYRE_PDL=0 GYRE_PDL=1; do steptime_run "$m1" 1 128 $e; done
  for e in GYRE_PDL=0 GYRE_PDL=1; do steptime_run "$m8" 1 2000 $e; done
  python3 tests/gpu/roofline.py "$m8" "$OUT/bandwidth.json" 256
  python3 tests/gpu/roofline.py "$m1" "$OUT/bandwidth.json" 256
  greedy_same "$m1" GYRE_PDL=0 GYRE_PDL=1
}

# Greedy tokens and top-2 logprobs on MODEL under two settings A and B
# (VAR=VALUE each): one prompt (so the matrix-vector kernel runs) and
# four, 64 new tokens; prints whether they are identical.
greedy_same() {
  local m=$1 a=$2 b=$3 p e
  python3 -c 'import json,random; r=random.Random(7); json.dump([[r.randrange(100,30000) for _ in range(n)] for n in (37,)], open("/tmp/p1.json","w")); json.dump([[r.randrange(100,30000) for _ in range(n)] for n in (5,40,77,130)], open("/tmp/p4.json","w"))'
  for p in p1 p4; do
    for e in a b; do
      env "${!e}" timeout 120 $B/examples/greedy "$m" /tmp/$p.json 64 cuda > /tmp/greedy-$p-$e.json 2>/tmp/greedy-$p-$e.log || tail -3 /tmp/greedy-$p-$e.log
    done
    if cmp -s /tmp/greedy-$p-a.json /tmp/greedy-$p-b.json && [ -s /tmp/greedy-$p-b.json ]; then
      echo "greedy $p: $a and $b identical ($(wc -c < /tmp/greedy-$p-b.json) bytes)"
    else
      echo "greedy $p: $a and $b DIFFER"; head -c 600 /tmp/greedy-$p-a.json; echo; head -c 600 /tmp/greedy-$p-b.json; echo
    fi
  done
}

step_stages() {
  # Each kernel stage's own device time in a batch-1 decode graph, without
  # hardware counters: GYRE_TWICE=STAGE launches that stage's kernels twice
  # (each rewrites the same outputs, so tokens do not change), and the
  # graph's replay time grows by the stage's cost in place (for gemv the
  # second read of a weight may partly hit L2). 8B then 1B shape, 128-token
  # prompt, the plain graph first and last; tests/gpu/stages.py takes the
  # differences. Then greedy tokens with every stage twice, which must be
  # those without.
  local m e
  for m in "$W/llama-3-8b" "$W/llama-3.2-1b"; do
    [ -d "$m" ] || continue
    for e in X=1 GYRE_TWICE=norm GYRE_TWICE=rope GYRE_TWICE=attn GYRE_TWICE=silu GYRE_TWICE=gemv X=1; do
      steptime_run "$m" 1 128 $e
    done
  done 2>&1 | tee -a "$OUT/stages.txt"
  python3 tests/gpu/stages.py "$OUT/stages.txt" "$W" 2>&1 | tee -a "$OUT/stages.txt"
  greedy_same "$W/llama-3.2-1b" X=1 GYRE_TWICE=all 2>&1 | tee -a "$OUT/stages.txt"
}

step_unroll() {
  # The one-row matrix-vector kernel with 4, 8 and 16 loads in flight per
  # lane (GYRE_GEMV_UNROLL): cuda_check's kernel checks and 8B-shape
  # projection timings, then batch-1 decode on the 8B (both orders) and 1B.
  local u m8="$W/llama-3-8b" m1="$W/llama-3.2-1b"
  for u in 4 8 16; do
    echo "== cuda_check GYRE_GEMV_UNROLL=$u"
    GYRE_GEMV_UNROLL=$u $B/examples/cuda_check "$m1" 2>&1 | grep -E "gemv|projection|rror|panic"
  done 2>&1 | tee -a "$OUT/unroll.txt"
  for u in 4 8 16 16 8 4; do steptime_run "$m8" 1 128 GYRE_GEMV_UNROLL=$u; done 2>&1 | tee -a "$OUT/unroll.txt"
  for u in 4 8 16; do steptime_run "$m1" 1 128 GYRE_GEMV_UNROLL=$u; done 2>&1 | tee -a "$OUT/unroll.txt"
}

step_gemv_split() {
  # The one-row matrix-vector kernel with each weight row split over 2, 4
  # or 8 warps (GYRE_GEMV_SPLIT; every product, or only those of at least
  # 8,192 columns: the down projection), against one warp a row:
  # cuda_check's kernel checks and 8B-shape projection timings, then
  # batch-1 decode on the 8B (both orders) and the 1B.
  local e m8="$W/llama-3-8b" m1="$W/llama-3.2-1b"
  local variants="GYRE_GEMV_SPLIT=1 GYRE_GEMV_SPLIT=2 GYRE_GEMV_SPLIT=4 GYRE_GEMV_SPLIT=8"
  for e in $variants; do
    echo "== cuda_check $e"
    env $e $B/examples/cuda_check "$m1" 2>&1 | grep -E "gemv|projection|rror|panic"
  done 2>&1 | tee -a "$OUT/gemv-split.txt"
  local runs="GYRE_GEMV_SPLIT=1 GYRE_GEMV_SPLIT=2 GYRE_GEMV_SPLIT=4 GYRE_GEMV_SPLIT=2,GYRE_GEMV_SPLIT_MIN_K=8192 GYRE_GEMV_SPLIT=4,GYRE_GEMV_SPLIT_MIN_K=8192"
  for m in "$m8" "$m1"; do
    for e in $runs $( [ "$m" = "$m8" ] && echo $runs | tr ' ' '\n' | tac ); do
      steptime_run "$m" 1 128 ${e//,/ }
    done
  done 2>&1 | tee -a "$OUT/gemv-split.txt"
}

step_gemv_silu() {
  # A one-row MLP's gate/up product and SiLU product in one kernel
  # (GYRE_GEMV_SILU=1) against the two kernels: cuda_check's bit-for-bit
  # comparison, then batch-1 decode on the 8B (alternating, both orders)
  # and the 1B.
  local e m8="$W/llama-3-8b" m1="$W/llama-3.2-1b"
  echo "== cuda_check" 2>&1 | tee -a "$OUT/gemv-silu.txt"
  $B/examples/cuda_check "$m1" 2>&1 | grep -E "silu|rror|panic" | tee -a "$OUT/gemv-silu.txt"
  for e in 0 1 1 0; do steptime_run "$m8" 1 128 GYRE_GEMV_SILU=$e; done 2>&1 | tee -a "$OUT/gemv-silu.txt"
  for e in 0 1; do steptime_run "$m1" 1 128 GYRE_GEMV_SILU=$e; done 2>&1 | tee -a "$OUT/gemv-silu.txt"
}

step_gemv_ab() {
  # The one-row kernel's variants side by side in one call, the 8B shape's
  # batch-1 decode step (CUDA graphs, graph replay time): each row split
  # over 4 warps (the default), over 1, 2 or 8 (GYRE_GEMV_SPLIT), split only
  # at 8,192 columns or more (GYRE_GEMV_SPLIT_MIN_K: the down projection);
  # rows over 8,192 columns on cuBLAS (GYRE_GEMV_MAX_K); gate/up and SiLU
  # in one kernel, its rows split as gemv's (GYRE_GEMV_SILU=1). cuda_check's
  # kernel checks (the SiLU kernel bit for bit at splits 1, 2, 4) and
  # projection timings for each split first; each 8B variant runs twice,
  # in opposite orders; then the 1B, and the 8B at a 2,000-token context.
  local e m8="$W/llama-3-8b" m1="$W/llama-3.2-1b"
  for e in GYRE_GEMV_SPLIT=1 GYRE_GEMV_SPLIT=2 GYRE_GEMV_SPLIT=8; do
    echo "== cuda_check $e"
    env $e timeout 60 $B/examples/cuda_check "$m1" 2>&1 | grep -E "gemv|projection|silu|rror|panic"
  done 2>&1 | tee -a "$OUT/gemv-ab.txt"
  local runs="GYRE_GEMV_SPLIT=1 X=1 GYRE_GEMV_SPLIT=2 GYRE_GEMV_SPLIT=8 GYRE_GEMV_SPLIT=8,GYRE_GEMV_SPLIT_MIN_K=8192 GYRE_GEMV_MAX_K=8192 GYRE_GEMV_SILU=1"
  for e in $runs $(echo $runs | tr ' ' '\n' | tac); do
    steptime_run "$m8" 1 128 ${e//,/ }
  done 2>&1 | tee -a "$OUT/gemv-ab.txt"
  for e in GYRE_GEMV_SPLIT=1 X=1 GYRE_GEMV_SPLIT=8 GYRE_GEMV_SILU=1 X=1; do
    steptime_run "$m1" 1 128 ${e//,/ }
  done 2>&1 | tee -a "$OUT/gemv-ab.txt"
  for e in GYRE_GEMV_SPLIT=1 X=1; do
    steptime_run "$m8" 1 2000 ${e//,/ }
  done 2>&1 | tee -a "$OUT/gemv-ab.txt"
}

step_attn_ab() {
  # Decode attention with fewer key splits (GYRE_ATTN_MIN_CHUNK: the fewest
  # keys a split takes; the default plan gives 32 at a 256-key stride, 8
  # splits, and one split needs no merge kernel): cuda_check's attention
  # checks at 256 and 2,048, then batch-1 decode on the 8B at a 128-token
  # prompt (both orders) and a 2,000-token one, and on the 1B.
  local e m8="$W/llama-3-8b" m1="$W/llama-3.2-1b"
  for e in 256 2048; do
    echo "== cuda_check GYRE_ATTN_MIN_CHUNK=$e"
    GYRE_ATTN_MIN_CHUNK=$e timeout 60 $B/examples/cuda_check "$m1" 2>&1 | grep -E "attention|rror|panic"
  done 2>&1 | tee -a "$OUT/attn-ab.txt"
  for e in 32 64 128 256 256 128 64 32; do
    steptime_run "$m8" 1 128 GYRE_ATTN_MIN_CHUNK=$e
  done 2>&1 | tee -a "$OUT/attn-ab.txt"
  for e in 32 256 1024 2048; do
    steptime_run "$m8" 1 2000 GYRE_ATTN_MIN_CHUNK=$e
  done 2>&1 | tee -a "$OUT/attn-ab.txt"
  for e in 32 256 32 256; do
    steptime_run "$m1" 1 128 GYRE_ATTN_MIN_CHUNK=$e
  done 2>&1 | tee -a "$OUT/attn-ab.txt"
}

step_kernels() {
  # Each kernel's device time in one batch-1 decode step of the 8B shape
  # (then the 1B), from Nsight Compute: eager steps (graphs and PDL off,
  # so kernels run one after another as ncu serialises them anyway),
  # caches not flushed and clocks not locked between kernels; two runs
  # with 2 and 6 new tokens, whose difference / 4 is one step
  # (tests/gpu/kernel_times.py).
  local m n
  command -v ncu >/dev/null || { echo "no ncu on this machine" | tee -a "$OUT/kernels.txt"; return 0; }
  for m in "$W/llama-3-8b" "$W/llama-3.2-1b"; do
    for n in 2 6; do
      GYRE_CUDA_GRAPHS=0 GYRE_PDL=0 DEVICE=cuda ROUNDS=1 timeout ${KERNELS_TIMEOUT:-240} \
        ncu --metrics gpu__time_duration.sum --csv --print-units base --cache-control none \
        --clock-control none --log-file /tmp/kernels-$n.csv $B/examples/steptime "$m" 128 $n 1 \
        > /tmp/kernels-$n.log 2>&1 || tail -5 /tmp/kernels-$n.log
    done
    echo "== $(basename "$m")"
    python3 tests/gpu/kernel_times.py /tmp/kernels-2.csv /tmp/kernels-6.csv 4 | head -40
  done 2>&1 | tee -a "$OUT/kernels.txt"
}

step_gemv_rows() {
  # The matrix-vector kernel at 2 and 4 rows (its default limit) against
  # cuBLAS (GYRE_GEMV=0), 8B shape, CUDA graphs on.
  local m="$W/llama-3-8b" streams
  [ -d "$m" ] || return 0
  for streams in 2 4; do
    for e in X=1 GYRE_GEMV=0; do steptime_run "$m" "$streams" 128 $e; done
  done 2>&1 | tee -a "$OUT/decode.txt"
}

step_profile() {
  # Device time of each operation of a decode step at batch 1 (PyTorch,
  # CUDA graphs): what the projections reach against the copy bandwidth.
  for shape in llama-3-8b llama-3.2-1b; do
    python3 tests/gpu/layer_profile.py --shape $shape --bandwidth "$OUT/bandwidth.json"
  done 2>&1 | tee -a "$OUT/profile.txt"
}

step_bench() {
  # gyre-bench's S1 (1 gRPC stream vs transformers batch 1) and S2 (16 HTTP
  # streams vs a static batch of 16) on the Llama-3-8B shape.
  local m="$W/llama-3-8b"
  cp tests/data/tokenizers/phi-3-mini-instruct/tokenizer.json "$m/"
  timeout ${BENCH_TIMEOUT:-300} $B/gyre-bench run --device cuda --model "$m" --only ${BENCH_ONLY:-S1,S2} \
    --python python3 --gyre-bin $B/gyre --json-out "$OUT/bench.json" 2>&1 | tail -30 | tee "$OUT/bench.txt"
  tail -40 /tmp/gyre-bench-*/gyre.log > "$OUT/bench-gyre.log" 2>/dev/null
  grep -E "ERROR|WARN" /tmp/gyre-bench-*/gyre.log | head -20
}

step_serve_smoke() {
  local m="$W/llama-3.2-1b"
  cp tests/data/tokenizers/phi-3-mini-instruct/tokenizer.json "$m/"
  $B/gyre serve --model "$m" --device cuda --http-addr 127.0.0.1:18080 --grpc-addr 127.0.0.1:18081 \
    > "$OUT/serve.log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf 127.0.0.1:18080/health >/dev/null && break; sleep 1; done
  curl -s 127.0.0.1:18080/v1/completions -H 'content-type: application/json' \
    -d '{"model":"llama-3.2-1b","prompt":[1,450,7483,310],"max_tokens":16,"temperature":0}' | tee "$OUT/serve-smoke.json"
  echo
  curl -s 127.0.0.1:18080/v1/completions -H 'content-type: application/json' \
    -d '{"model":"llama-3.2-1b","prompt":[1,450,7483,310],"max_tokens":16,"temperature":0.8,"top_p":0.9,"seed":3,"stream":true}' | tail -3
  kill $pid; wait $pid
  tail -5 "$OUT/serve.log"
}

step_bench_sweep() {
  # gyre-bench's G1 (1, 8, 64 and 256 streams over gRPC and over HTTP vs
  # transformers' static batches of the same sizes, all in one process) and
  # G2 (TTFT of 64 streams of 2,048-token prompts: a burst, then steady
  # state, against the 800 ms objective) on the Llama-3-8B shape, one
  # server sized for it. ~3-4 min on an H100; the figures also go to
  # stderr as each level ends, in case the timeout cuts the run short.
  local m="$W/llama-3-8b" tmp=/tmp/gyre-sweep
  cp tests/data/tokenizers/phi-3-mini-instruct/tokenizer.json "$m/"
  rm -rf "$tmp" && mkdir -p "$tmp"
  TMPDIR=$tmp timeout ${SWEEP_TIMEOUT:-300} $B/gyre-bench --client-threads 4 run --device cuda \
    --model "$m" --only G1,G2 --python python3 --gyre-bin $B/gyre --json-out "$OUT/bench-sweep.json" \
    --hf-repeats ${SWEEP_HF_REPEATS:-2} --server-arg=--max-running=256 \
    --server-arg=--kv-cache-mib=24576 --server-arg=--max-batch-tokens=2048 2>&1 \
    | tail -80 | tee "$OUT/bench-sweep.txt"
  tail -40 "$tmp"/gyre-bench-*/gyre.log > "$OUT/bench-sweep-gyre.log" 2>/dev/null
  grep -E "ERROR|WARN" "$tmp"/gyre-bench-*/gyre.log | head -20
}

for s in "$@"; do
  echo "=== step $s ($(date +%T))"
  "step_${s//-/_}"
done

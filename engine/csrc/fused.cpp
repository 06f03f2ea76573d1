// Fused CUDA kernels for the decode path: residual add + RMSNorm, rotary
// embedding of the query and key heads + the paged KV write, SiLU(gate)
// times up, a matrix-vector product for one-row projections, and decode
// attention over the paged pool in place, split over the keys. At batch 1 a
// decode step is weight-bandwidth bound, and each small libtorch kernel
// costs a few microseconds of fixed time; the first three replace about a
// dozen of them per layer, the attention kernel the key and value gathers
// and the flash attention call.
//
// The kernels are compiled at run time with NVRTC (the CUDA wheels torch
// depends on carry it) and launched through the driver API, both opened
// with dlopen, so nothing here needs nvcc at build time, and a machine
// without them (the CPU machines) only loses the fused path. Launches go to
// the current CUDA stream, so decode graphs capture them.
//
// Each kernel rounds to bf16 where transformers' eager PyTorch code does
// (every elementwise op computes in float32 and rounds its result), so the
// fused path does transformers' arithmetic; only the norm's float32 sum of
// squares is added in another order.
//
// Errors are returned as text, never thrown into Rust.

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

const char* kSource = R"CUDA(
typedef unsigned short bf16;

__device__ __forceinline__ float ld(bf16 v) { return __uint_as_float(((unsigned)v) << 16); }

// float -> bf16, round to nearest even (as c10::BFloat16).
__device__ __forceinline__ bf16 st(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16)(u >> 16);
}

__device__ __forceinline__ float rd(float f) { return ld(st(f)); }

// Programmatic dependent launch (Hopper on): the launcher lets each kernel
// start while the one before it in the stream is still running. A kernel
// does only work that needs nothing the kernels before it write (a
// projection's first weight loads) before dep_wait(), which returns once the
// previous kernel has finished and its writes are visible; dep_launch()
// then lets the next kernel start its blocks. Without the launch attribute,
// or before sm_90, both are no-ops.
__device__ __forceinline__ void dep_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void dep_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ float block_sum(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? part[lane] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  float s = part[0];
  __syncthreads();
  return s;
}

// One block per row. With delta: x_out = bf16(x + delta); then
// h = bf16(w * bf16(x' * rsqrt(mean(x'^2) + eps))) in float32, x' the
// (new) residual, as transformers' LlamaRMSNorm.
extern "C" __global__ void gyre_add_rms_norm(const bf16* x, const bf16* delta, const bf16* w,
                                             bf16* x_out, bf16* h, int hidden, float eps) {
  dep_wait();
  dep_launch();
  long base = (long)blockIdx.x * hidden;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = ld(x[base + i]);
    if (delta) {
      v = rd(v + ld(delta[base + i]));
      x_out[base + i] = st(v);
    }
    ss += v * v;
  }
  float inv = rsqrtf(block_sum(ss) / (float)hidden + eps);
  const bf16* src = delta ? x_out : x;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    h[base + i] = st(ld(w[i]) * rd(ld(src[base + i]) * inv));
}

// One block per token of qkv [n, (heads + 2 kv_heads) * head_dim]: rotates
// the query and key heads (x * cos + swapped(x) * signed_sin, each product
// and the sum rounded to bf16, as transformers' apply_rotary_pos_emb with
// bf16 tables), writes the queries to q_out [n, heads, head_dim] and the
// keys and values to the pool's rows [slot, kv_heads, head_dim].
extern "C" __global__ void gyre_rope_kv(const bf16* qkv, const bf16* cos, const bf16* ssin,
                                        const long long* slots, bf16* q_out, bf16* k_cache,
                                        bf16* v_cache, int heads, int kv_heads, int head_dim) {
  dep_wait();
  dep_launch();
  int tok = blockIdx.x;
  int width = (heads + 2 * kv_heads) * head_dim;
  int half = head_dim / 2;
  const bf16* row = qkv + (long)tok * width;
  const bf16* c = cos + (long)tok * head_dim;
  const bf16* s = ssin + (long)tok * head_dim;
  long long slot = slots[tok];
  for (int e = threadIdx.x; e < width; e += blockDim.x) {
    int hd = e / head_dim, d = e - hd * head_dim;
    if (hd < heads + kv_heads) {
      int p = d < half ? d + half : d - half;
      float a = rd(ld(row[e]) * ld(c[d]));
      float b = rd(ld(row[hd * head_dim + p]) * ld(s[d]));
      bf16 out = st(a + b);
      if (hd < heads)
        q_out[(long)tok * heads * head_dim + e] = out;
      else
        k_cache[(slot * kv_heads + (hd - heads)) * head_dim + d] = out;
    } else {
      v_cache[(slot * kv_heads + (hd - heads - kv_heads)) * head_dim + d] = row[e];
    }
  }
}

// gu [n, 2 inter] (gate columns first) -> out [n, inter]:
// bf16(bf16(silu(gate)) * up), as transformers' act_fn(gate) * up.
extern "C" __global__ void gyre_silu_mul(const bf16* gu, bf16* out, long n, int inter) {
  dep_wait();
  dep_launch();
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n * inter) return;
  long r = i / inter;
  int j = (int)(i - r * inter);
  float g = ld(gu[r * 2 * inter + j]);
  float u = ld(gu[r * 2 * inter + inter + j]);
  out[i] = st(rd(g / (1.0f + expf(-g))) * u);
}
// ---- Matrix-vector products for decode steps: y[m, n] = x[m, k] w[n, k]^T
// (+ bias[n]), bf16 in and out, float32 sums, for a few rows of x. A step
// at batch 1 streams every weight once; one warp per output feature reads
// its weight row with 16-byte loads that skip L1, several in flight per
// lane, and keeps the rows of x (a few KB, shared by every warp) in L1.
// k % 8 == 0 and every row 16-byte aligned (the launcher checks).
struct alignas(16) U4 { unsigned x, y, z, w; };
struct alignas(8) U2 { unsigned x, y; };

__device__ __forceinline__ U4 ld_stream(const U4* p) {
  U4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}
__device__ __forceinline__ float lo16(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi16(unsigned u) { return __uint_as_float(u & 0xffff0000u); }

__device__ __forceinline__ float dot8(U4 a, U4 b, float s) {
  s = fmaf(lo16(a.x), lo16(b.x), s);
  s = fmaf(hi16(a.x), hi16(b.x), s);
  s = fmaf(lo16(a.y), lo16(b.y), s);
  s = fmaf(hi16(a.y), hi16(b.y), s);
  s = fmaf(lo16(a.z), lo16(b.z), s);
  s = fmaf(hi16(a.z), hi16(b.z), s);
  s = fmaf(lo16(a.w), lo16(b.w), s);
  s = fmaf(hi16(a.w), hi16(b.w), s);
  return s;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// U: loads in flight per lane.
template <int M, int U>
__device__ __forceinline__ void gemv(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                     const bf16* __restrict__ bias, bf16* __restrict__ y, int m,
                                     int n, int k) {
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int k8 = k >> 3;
  const U4* wr = reinterpret_cast<const U4*>(w + (long)(row < n ? row : 0) * k);
  const U4* xr = reinterpret_cast<const U4*>(x);
  // The first weight loads need nothing the previous kernel writes: they
  // are in flight while it finishes.
  U4 wv[U];
#pragma unroll
  for (int u = 0; u < U; u++) {
    int j = lane + u * 32;
    wv[u] = row < n && j < k8 ? ld_stream(wr + j) : U4{0u, 0u, 0u, 0u};
  }
  dep_wait();
  dep_launch();
  if (row >= n) return;  // the whole warp
  float acc[M];
#pragma unroll
  for (int b = 0; b < M; b++) acc[b] = 0.0f;
  for (int i = lane; i < k8; i += 32 * U) {
    if (i != lane) {
#pragma unroll
      for (int u = 0; u < U; u++) {
        int j = i + u * 32;
        wv[u] = j < k8 ? ld_stream(wr + j) : U4{0u, 0u, 0u, 0u};
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int j = i + u * 32;
      if (j < k8) {
#pragma unroll
        for (int b = 0; b < M; b++)
          if (b < m) acc[b] = dot8(wv[u], xr[(long)b * k8 + j], acc[b]);
      }
    }
  }
#pragma unroll
  for (int b = 0; b < M; b++) acc[b] = warp_sum(acc[b]);
  if (lane == 0) {
    float bb = bias ? ld(bias[row]) : 0.0f;
#pragma unroll
    for (int b = 0; b < M; b++)
      if (b < m) y[(long)b * n + row] = st(acc[b] + bb);
  }
}

#define GYRE_GEMV(M)                                                                          \
  extern "C" __global__ void gyre_gemv##M(const bf16* x, const bf16* w, const bf16* bias,     \
                                          bf16* y, int m, int n, int k) {                     \
    gemv<M, 4>(x, w, bias, y, m, n, k);                                                       \
  }
GYRE_GEMV(1)
GYRE_GEMV(2)
GYRE_GEMV(4)
GYRE_GEMV(8)
// Part p of S of one weight row `wr` against x `xr` (k8 16-byte words):
// its 32-load chunks p, p + S, p + 2S, ..., four loads in flight a lane,
// the first issued before the kernel waits for the previous one. The
// warp's float32 sum, in every lane.
template <int S>
__device__ __forceinline__ float split_part(const U4* __restrict__ wr, const U4* __restrict__ xr,
                                            int k8, int p, int lane, bool live) {
  constexpr int U = 4;
  constexpr int STEP = 32 * S;  // between a part's chunks, in 16-byte loads
  const int i0 = p * 32 + lane;
  U4 wv[U];
#pragma unroll
  for (int u = 0; u < U; u++) {
    int j = i0 + u * STEP;
    wv[u] = live && j < k8 ? ld_stream(wr + j) : U4{0u, 0u, 0u, 0u};
  }
  dep_wait();
  dep_launch();
  float acc = 0.0f;
  if (live) {
    for (int i = i0; i < k8; i += STEP * U) {
      if (i != i0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
          int j = i + u * STEP;
          wv[u] = j < k8 ? ld_stream(wr + j) : U4{0u, 0u, 0u, 0u};
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        int j = i + u * STEP;
        if (j < k8) acc = dot8(wv[u], xr[j], acc);
      }
    }
  }
  return warp_sum(acc);
}

// One row, each weight row split over S warps of the block (8 / S rows a
// block): part p of a row takes its 32-load chunks p, p + S, p + 2S, ...;
// the parts' float32 sums are added in order in shared memory. For long
// rows, where one warp a row leaves too little work in flight.
template <int S>
__device__ __forceinline__ void gemv_split(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                           const bf16* __restrict__ bias, bf16* __restrict__ y,
                                           int n, int k) {
  __shared__ float part[8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * (8 / S) + warp / S;
  const bool live = row < n;
  const U4* wr = reinterpret_cast<const U4*>(w + (long)(live ? row : 0) * k);
  float acc = split_part<S>(wr, reinterpret_cast<const U4*>(x), k >> 3, warp % S, lane, live);
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  if (live && warp % S == 0 && lane == 0) {
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < S; q++) sum += part[warp + q];
    y[row] = st(sum + (bias ? ld(bias[row]) : 0.0f));
  }
}

#define GYRE_GEMV_SPLIT(S)                                                                    \
  extern "C" __global__ void gyre_gemv1_s##S(const bf16* x, const bf16* w, const bf16* bias,  \
                                             bf16* y, int m, int n, int k) {                  \
    gemv_split<S>(x, w, bias, y, n, k);                                                       \
  }
GYRE_GEMV_SPLIT(2)
GYRE_GEMV_SPLIT(4)
GYRE_GEMV_SPLIT(8)

// One row through a stacked gate/up weight w [2 inter, k] (gate rows
// first) and the SiLU product: y[j] = bf16(bf16(silu(g)) * u) for j <
// inter, g and u the bf16 sums of rows j and inter + j. Each row's sum is
// taken in gyre_gemv1's order (one warp a row: taken at GYRE_GEMV_SPLIT=1,
// and at 8) and rounded as it rounds its output, and the product as
// gyre_silu_mul's, so the result is theirs bit for bit, in one kernel
// instead of two and without the [2 inter] intermediate.
extern "C" __global__ void gyre_gemv1_silu(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                           bf16* __restrict__ y, int inter, int k) {
  constexpr int U = 4;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int k8 = k >> 3;
  const bool live = row < inter;
  const long r = live ? row : 0;
  const U4* gr = reinterpret_cast<const U4*>(w + r * k);
  const U4* ur = reinterpret_cast<const U4*>(w + (r + inter) * k);
  const U4* xr = reinterpret_cast<const U4*>(x);
  U4 gv[U], uv[U];
#pragma unroll
  for (int u = 0; u < U; u++) {
    int j = lane + u * 32;
    bool in = live && j < k8;
    gv[u] = in ? ld_stream(gr + j) : U4{0u, 0u, 0u, 0u};
    uv[u] = in ? ld_stream(ur + j) : U4{0u, 0u, 0u, 0u};
  }
  dep_wait();
  dep_launch();
  if (!live) return;  // the whole warp
  float ag = 0.0f, au = 0.0f;
  for (int i = lane; i < k8; i += 32 * U) {
    if (i != lane) {
#pragma unroll
      for (int u = 0; u < U; u++) {
        int j = i + u * 32;
        gv[u] = j < k8 ? ld_stream(gr + j) : U4{0u, 0u, 0u, 0u};
        uv[u] = j < k8 ? ld_stream(ur + j) : U4{0u, 0u, 0u, 0u};
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int j = i + u * 32;
      if (j < k8) {
        U4 xv = xr[j];
        ag = dot8(gv[u], xv, ag);
        au = dot8(uv[u], xv, au);
      }
    }
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0) {
    // + 0.0f as gyre_gemv1 adds its (absent) bias: the same bits for -0.
    float g = rd(ag + 0.0f), u = rd(au + 0.0f);
    y[row] = st(rd(g / (1.0f + expf(-g))) * u);
  }
}

// gyre_gemv1_silu with each gate and up row split over S warps as
// gemv_split splits it (S = 2 or 4; the block's 8 warps hold 8 / (2 S)
// outputs, a gate row's S parts then its up row's): the parts' sums are
// added and rounded in gemv_split's order, then multiplied as
// gyre_silu_mul multiplies, so the result is gyre_gemv1_s<S> then
// gyre_silu_mul bit for bit.
template <int S>
__device__ __forceinline__ void gemv_silu_split(const bf16* __restrict__ x,
                                                const bf16* __restrict__ w,
                                                bf16* __restrict__ y, int inter, int k) {
  constexpr int OUTS = 8 / (2 * S);
  __shared__ float part[8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int out = blockIdx.x * OUTS + warp / (2 * S);
  const int up = (warp / S) & 1;
  const bool live = out < inter;
  const long row = (long)(live ? out : 0) + (up ? inter : 0);
  const U4* wr = reinterpret_cast<const U4*>(w + row * k);
  float acc = split_part<S>(wr, reinterpret_cast<const U4*>(x), k >> 3, warp % S, lane, live);
  if (lane == 0) part[warp] = acc;
  __syncthreads();
  if (live && warp % (2 * S) == 0 && lane == 0) {
    float sg = 0.0f, su = 0.0f;
#pragma unroll
    for (int q = 0; q < S; q++) sg += part[warp + q];
#pragma unroll
    for (int q = 0; q < S; q++) su += part[warp + S + q];
    // + 0.0f as gemv_split adds its (absent) bias: the same bits for -0.
    float g = rd(sg + 0.0f), u = rd(su + 0.0f);
    y[out] = st(rd(g / (1.0f + expf(-g))) * u);
  }
}

#define GYRE_GEMV_SILU_SPLIT(S)                                                               \
  extern "C" __global__ void gyre_gemv1_silu_s##S(const bf16* x, const bf16* w, bf16* y,      \
                                                  int inter, int k) {                         \
    gemv_silu_split<S>(x, w, y, inter, k);                                                    \
  }
GYRE_GEMV_SILU_SPLIT(2)
GYRE_GEMV_SILU_SPLIT(4)

extern "C" __global__ void gyre_gemv1_u8(const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                                         int m, int n, int k) {
  gemv<1, 8>(x, w, bias, y, m, n, k);
}
extern "C" __global__ void gyre_gemv1_u16(const bf16* x, const bf16* w, const bf16* bias, bf16* y,
                                          int m, int n, int k) {
  gemv<1, 16>(x, w, bias, y, m, n, k);
}

// ---- Decode attention over the paged pool, split over the keys (flash-
// decoding). Every sequence has one query; its keys are the pool rows
// gather[cu_k[b] .. cu_k[b] + len), len = used[b] (decode graphs: keys
// packed at a fixed stride, of which each sequence uses its first used[b])
// or cu_k[b + 1] - cu_k[b]. Grid (splits, kv_heads, sequences), 4 warps a
// block: block s scores keys [s * chunk, (s + 1) * chunk) of one kv head
// for every query head of its group, each warp taking rounds of 8 keys
// (their slots and rows loaded before any arithmetic, so the loads are in
// flight together), with an online softmax in float32; the warps' partial
// results merge in shared memory. With one split the block writes the
// output; otherwise it writes its (max, sum, unnormalised output) and
// gyre_attn_combine merges the splits. The pool is read in place: no
// gather copy.
template <int W>
__device__ __forceinline__ void load_words(const bf16* p, unsigned* out) {
  if constexpr (W == 1) {
    out[0] = *reinterpret_cast<const unsigned*>(p);
  } else if constexpr (W == 2) {
    U2 v = *reinterpret_cast<const U2*>(p);
    out[0] = v.x;
    out[1] = v.y;
  } else {
    U4 v = *reinterpret_cast<const U4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
}

#define NEG_INF __int_as_float(0xff800000)
constexpr int ATTN_WARPS = 4;
constexpr int ATTN_MAXG = 8;
constexpr int ATTN_KB = 8;

__device__ __forceinline__ int seq_len(const int* cu_k, const int* used, int b) {
  return used ? used[b] : cu_k[b + 1] - cu_k[b];
}

template <int D>
__device__ __forceinline__ void attn_split(const bf16* __restrict__ q, const bf16* __restrict__ kc,
                                           const bf16* __restrict__ vc,
                                           const long long* __restrict__ gather,
                                           const int* __restrict__ cu_k,
                                           const int* __restrict__ used, bf16* __restrict__ out,
                                           float* __restrict__ part, float* __restrict__ ml,
                                           int heads, int kv_heads, int chunk, float scale) {
  constexpr int E = D / 32;  // elements of a head a lane holds
  constexpr int WD = E / 2;  // as 32-bit words
  __shared__ float sm_m[ATTN_WARPS][ATTN_MAXG], sm_l[ATTN_WARPS][ATTN_MAXG];
  __shared__ float sm_acc[ATTN_WARPS][ATTN_MAXG][D];
  dep_wait();
  dep_launch();
  const int splits = gridDim.x, s = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int group = heads / kv_heads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int start = cu_k[b];
  const int len = seq_len(cu_k, used, b);
  const int lo = s * chunk, hi = min(lo + chunk, len);
  float qf[ATTN_MAXG][E], m[ATTN_MAXG], l[ATTN_MAXG], acc[ATTN_MAXG][E];
#pragma unroll
  for (int h = 0; h < ATTN_MAXG; h++) {
    m[h] = NEG_INF;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) {
      acc[h][e] = 0.0f;
      qf[h][e] = h < group ? ld(q[((long)b * heads + g * group + h) * D + lane * E + e]) : 0.0f;
    }
  }
  for (int j0 = lo + warp * ATTN_KB; j0 < hi; j0 += ATTN_WARPS * ATTN_KB) {
    long long slot = 0;
    if (lane < ATTN_KB && j0 + lane < hi) slot = gather[start + j0 + lane];
    unsigned kw[ATTN_KB][WD], vw[ATTN_KB][WD];
#pragma unroll
    for (int kk = 0; kk < ATTN_KB; kk++) {
      long long sl = __shfl_sync(0xffffffffu, slot, kk);
      if (j0 + kk < hi) {
        long off = ((long)sl * kv_heads + g) * D + lane * E;
        load_words<WD>(kc + off, kw[kk]);
        load_words<WD>(vc + off, vw[kk]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < ATTN_KB; kk++) {
      if (j0 + kk >= hi) break;  // the same for the whole warp
      float kf[E], vf[E];
#pragma unroll
      for (int e = 0; e < WD; e++) {
        kf[2 * e] = lo16(kw[kk][e]);
        kf[2 * e + 1] = hi16(kw[kk][e]);
        vf[2 * e] = lo16(vw[kk][e]);
        vf[2 * e + 1] = hi16(vw[kk][e]);
      }
#pragma unroll
      for (int h = 0; h < ATTN_MAXG; h++) {
        if (h >= group) break;
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) d = fmaf(qf[h][e], kf[e], d);
        float sc = warp_sum(d) * scale;
        float mn = fmaxf(m[h], sc);
        float c = __expf(m[h] - mn), p = __expf(sc - mn);
        l[h] = l[h] * c + p;
#pragma unroll
        for (int e = 0; e < E; e++) acc[h][e] = fmaf(acc[h][e], c, p * vf[e]);
        m[h] = mn;
      }
    }
  }
#pragma unroll
  for (int h = 0; h < ATTN_MAXG; h++) {
    if (h >= group) break;
    if (lane == 0) {
      sm_m[warp][h] = m[h];
      sm_l[warp][h] = l[h];
    }
#pragma unroll
    for (int e = 0; e < E; e++) sm_acc[warp][h][lane * E + e] = acc[h][e];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < group * D; t += blockDim.x) {
    int h = t / D, d = t - h * D;
    float mx = NEG_INF;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; w++) mx = fmaxf(mx, sm_m[w][h]);
    float sum = 0.0f, a = 0.0f;
    if (mx != NEG_INF) {
#pragma unroll
      for (int w = 0; w < ATTN_WARPS; w++) {
        float c = __expf(sm_m[w][h] - mx);
        sum += sm_l[w][h] * c;
        a += sm_acc[w][h][d] * c;
      }
    }
    long row = (long)b * heads + g * group + h;
    if (splits == 1) {
      out[row * D + d] = st(sum > 0.0f ? a / sum : 0.0f);
    } else {
      long at = row * splits + s;
      part[at * D + d] = a;
      if (d == 0) {
        ml[at * 2] = mx;
        ml[at * 2 + 1] = sum;
      }
    }
  }
}

// Grid (heads, sequences), D threads: merges the splits of one head.
template <int D>
__device__ __forceinline__ void attn_combine(const float* __restrict__ part,
                                             const float* __restrict__ ml,
                                             const int* __restrict__ cu_k,
                                             const int* __restrict__ used, bf16* __restrict__ out,
                                             int heads, int splits, int chunk) {
  dep_wait();
  dep_launch();
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const int len = seq_len(cu_k, used, b);
  const int ns = min(splits, (len + chunk - 1) / chunk);
  const long row = (long)b * heads + h;
  float mx = NEG_INF;
  for (int s = 0; s < ns; s++) mx = fmaxf(mx, ml[(row * splits + s) * 2]);
  float sum = 0.0f, a = 0.0f;
  if (mx != NEG_INF) {
    for (int s = 0; s < ns; s++) {
      long at = row * splits + s;
      float c = __expf(ml[at * 2] - mx);
      sum += ml[at * 2 + 1] * c;
      a += part[at * D + d] * c;
    }
  }
  out[row * D + d] = st(sum > 0.0f ? a / sum : 0.0f);
}

#define GYRE_ATTN(D)                                                                          \
  extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32) gyre_attn_split##D(          \
      const bf16* q, const bf16* kc, const bf16* vc, const long long* gather, const int* cu_k, \
      const int* used, bf16* out, float* part, float* ml, int heads, int kv_heads, int chunk,  \
      float scale) {                                                                          \
    attn_split<D>(q, kc, vc, gather, cu_k, used, out, part, ml, heads, kv_heads, chunk,       \
                  scale);                                                                     \
  }                                                                                           \
  extern "C" __global__ void gyre_attn_combine##D(const float* part, const float* ml,         \
                                                  const int* cu_k, const int* used, bf16* out, \
                                                  int heads, int splits, int chunk) {         \
    attn_combine<D>(part, ml, cu_k, used, out, heads, splits, chunk);                         \
  }
GYRE_ATTN(64)
GYRE_ATTN(128)
)CUDA";

// The few NVRTC and driver entry points used, declared here so no header
// beyond the runtime's is needed.
using nvrtcProgram = void*;
using CUmodule = void*;
using CUfunction = void*;
using FnCreate = int (*)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                         const char* const*);
using FnCompile = int (*)(nvrtcProgram, int, const char* const*);
using FnLogSize = int (*)(nvrtcProgram, size_t*);
using FnLog = int (*)(nvrtcProgram, char*);
using FnDestroy = int (*)(nvrtcProgram*);
using FnErrStr = const char* (*)(int);
using FnModuleLoad = int (*)(CUmodule*, const void*);
using FnGetFunction = int (*)(CUfunction*, CUmodule, const char*);
using FnLaunch = int (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);
// cuLaunchKernelEx, with cuda.h's launch configuration types.
using FnLaunchEx = int (*)(const ::CUlaunchConfig*, CUfunction, void**, void**);

struct Nvrtc {
  FnCreate create = nullptr;
  FnCompile compile = nullptr;
  FnLogSize log_size = nullptr;
  FnLog log = nullptr;
  FnLogSize cubin_size = nullptr;
  FnLog cubin = nullptr;
  FnDestroy destroy = nullptr;
  FnErrStr err = nullptr;
};

void* open_first(const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL)) return h;
  }
  return nullptr;
}

// NVRTC by its soname, else beside libtorch (torch/lib/../../nvidia/cu13/lib).
bool load_nvrtc(Nvrtc& f, std::string& why) {
  std::vector<std::string> names = {"libnvrtc.so.13", "libnvrtc.so"};
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&c10::cuda::getCurrentCUDAStream), &info) &&
      info.dli_fname) {
    std::string lib(info.dli_fname);
    auto slash = lib.rfind('/');
    if (slash != std::string::npos)
      names.push_back(lib.substr(0, slash) + "/../../nvidia/cu13/lib/libnvrtc.so.13");
  }
  void* h = open_first(names);
  if (!h) {
    why = "libnvrtc not found";
    return false;
  }
  // NVRTC opens its builtins library by name at compile time: load it
  // first from NVRTC's own directory, which need not be on the search path.
  using FnVersion = int (*)(int*, int*);
  auto version = reinterpret_cast<FnVersion>(dlsym(h, "nvrtcVersion"));
  int major = 0, minor = 0;
  if (version && version(&major, &minor) == 0 && dladdr(reinterpret_cast<void*>(version), &info) &&
      info.dli_fname) {
    std::string lib(info.dli_fname);
    auto slash = lib.rfind('/');
    std::string dir = slash == std::string::npos ? "." : lib.substr(0, slash);
    dlopen((dir + "/libnvrtc-builtins.so." + std::to_string(major) + "." + std::to_string(minor))
               .c_str(),
           RTLD_NOW | RTLD_GLOBAL);
  }
  f.create = reinterpret_cast<FnCreate>(dlsym(h, "nvrtcCreateProgram"));
  f.compile = reinterpret_cast<FnCompile>(dlsym(h, "nvrtcCompileProgram"));
  f.log_size = reinterpret_cast<FnLogSize>(dlsym(h, "nvrtcGetProgramLogSize"));
  f.log = reinterpret_cast<FnLog>(dlsym(h, "nvrtcGetProgramLog"));
  f.cubin_size = reinterpret_cast<FnLogSize>(dlsym(h, "nvrtcGetCUBINSize"));
  f.cubin = reinterpret_cast<FnLog>(dlsym(h, "nvrtcGetCUBIN"));
  f.destroy = reinterpret_cast<FnDestroy>(dlsym(h, "nvrtcDestroyProgram"));
  f.err = reinterpret_cast<FnErrStr>(dlsym(h, "nvrtcGetErrorString"));
  if (!f.create || !f.compile || !f.log_size || !f.log || !f.cubin_size || !f.cubin ||
      !f.destroy || !f.err) {
    why = "libnvrtc lacks an entry point";
    return false;
  }
  return true;
}

// Compiles the kernels to a cubin for sm_<arch> (e.g. 90).
bool compile(int arch, std::vector<char>& cubin, std::string& why) {
  Nvrtc f;
  if (!load_nvrtc(f, why)) return false;
  nvrtcProgram prog = nullptr;
  int rc = f.create(&prog, kSource, "gyre_fused.cu", 0, nullptr, nullptr);
  if (rc != 0) {
    why = std::string("nvrtcCreateProgram: ") + f.err(rc);
    return false;
  }
  std::string gpu = "--gpu-architecture=sm_" + std::to_string(arch);
  const char* opts[] = {gpu.c_str(), "--std=c++17"};
  rc = f.compile(prog, 2, opts);
  if (rc != 0) {
    size_t n = 0;
    f.log_size(prog, &n);
    std::string log(n, '\0');
    if (n > 0) f.log(prog, log.data());
    why = std::string("nvrtcCompileProgram: ") + f.err(rc) + ": " + log;
    f.destroy(&prog);
    return false;
  }
  size_t n = 0;
  f.cubin_size(prog, &n);
  cubin.assign(n, 0);
  f.cubin(prog, cubin.data());
  f.destroy(&prog);
  return true;
}

struct Kernels {
  bool ready = false;
  std::string why;
  FnLaunch launch = nullptr;
  // Programmatic dependent launch: sm_90 and later, unless GYRE_PDL=0.
  FnLaunchEx launch_ex = nullptr;
  CUfunction add_rms_norm = nullptr, rope_kv = nullptr, silu_mul = nullptr;
  CUfunction gemv[4] = {nullptr, nullptr, nullptr, nullptr};  // rows <= 1, 2, 4, 8
  CUfunction gemv1_u8 = nullptr, gemv1_u16 = nullptr, gemv1_silu = nullptr;
  CUfunction gemv1_silu_split[2] = {nullptr, nullptr};  // 2, 4 warps a row
  int gemv_unroll = 4;  // loads in flight per lane at one row (GYRE_GEMV_UNROLL)
  // One-row products with k >= gemv_split_min_k split each weight row over
  // gemv_split warps (GYRE_GEMV_SPLIT, GYRE_GEMV_SPLIT_MIN_K; 1: no split).
  // Four: on an H200 the 8B shape's batch-1 decode graph took 4.585 ms
  // against 4.750 with one warp a row, 4.68 with 8 and 4.78 with 2.
  CUfunction gemv1_split[3] = {nullptr, nullptr, nullptr};  // 2, 4, 8 warps a row
  int gemv_split = 4;
  long gemv_split_min_k = 0;
  CUfunction attn_split64 = nullptr, attn_combine64 = nullptr;
  CUfunction attn_split128 = nullptr, attn_combine128 = nullptr;
  int sms = 0;
};

Kernels& kernels() {
  static Kernels k;
  return k;
}

void put(char* err, size_t len, const std::string& what) {
  if (len > 0) {
    std::strncpy(err, what.c_str(), len - 1);
    err[len - 1] = '\0';
  }
}

bool init_locked(Kernels& k, std::string& why) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    why = "no CUDA device";
    return false;
  }
  // The runtime makes the device's primary context current on this thread;
  // the driver calls below use it.
  cudaFree(nullptr);
  std::vector<char> cubin;
  if (!compile(major * 10 + minor, cubin, why)) return false;
  void* cu = open_first({"libcuda.so.1", "libcuda.so"});
  if (!cu) {
    why = "libcuda not found";
    return false;
  }
  auto load = reinterpret_cast<FnModuleLoad>(dlsym(cu, "cuModuleLoadData"));
  auto get = reinterpret_cast<FnGetFunction>(dlsym(cu, "cuModuleGetFunction"));
  k.launch = reinterpret_cast<FnLaunch>(dlsym(cu, "cuLaunchKernel"));
  if (!load || !get || !k.launch) {
    why = "libcuda lacks an entry point";
    return false;
  }
  if (const char* u = std::getenv("GYRE_GEMV_UNROLL")) {
    int v = std::atoi(u);
    if (v == 4 || v == 8 || v == 16) k.gemv_unroll = v;
  }
  if (const char* v = std::getenv("GYRE_GEMV_SPLIT")) {
    int sp = std::atoi(v);
    if (sp == 1 || sp == 2 || sp == 4 || sp == 8) k.gemv_split = sp;
  }
  if (const char* v = std::getenv("GYRE_GEMV_SPLIT_MIN_K")) k.gemv_split_min_k = std::atol(v);
  const char* pdl = std::getenv("GYRE_PDL");
  if (major >= 9 && !(pdl && std::strcmp(pdl, "0") == 0))
    k.launch_ex = reinterpret_cast<FnLaunchEx>(dlsym(cu, "cuLaunchKernelEx"));
  CUmodule m = nullptr;
  if (int rc = load(&m, cubin.data())) {
    why = "cuModuleLoadData failed: " + std::to_string(rc);
    return false;
  }
  if (get(&k.add_rms_norm, m, "gyre_add_rms_norm") || get(&k.rope_kv, m, "gyre_rope_kv") ||
      get(&k.silu_mul, m, "gyre_silu_mul") || get(&k.gemv[0], m, "gyre_gemv1") ||
      get(&k.gemv[1], m, "gyre_gemv2") || get(&k.gemv[2], m, "gyre_gemv4") ||
      get(&k.gemv[3], m, "gyre_gemv8") || get(&k.gemv1_u8, m, "gyre_gemv1_u8") ||
      get(&k.gemv1_u16, m, "gyre_gemv1_u16") || get(&k.gemv1_silu, m, "gyre_gemv1_silu") ||
      get(&k.gemv1_silu_split[0], m, "gyre_gemv1_silu_s2") ||
      get(&k.gemv1_silu_split[1], m, "gyre_gemv1_silu_s4") ||
      get(&k.gemv1_split[0], m, "gyre_gemv1_s2") ||
      get(&k.gemv1_split[1], m, "gyre_gemv1_s4") || get(&k.gemv1_split[2], m, "gyre_gemv1_s8") ||
      get(&k.attn_split64, m, "gyre_attn_split64") ||
      get(&k.attn_combine64, m, "gyre_attn_combine64") ||
      get(&k.attn_split128, m, "gyre_attn_split128") ||
      get(&k.attn_combine128, m, "gyre_attn_combine128")) {
    why = "cuModuleGetFunction failed";
    return false;
  }
  if (cudaDeviceGetAttribute(&k.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      k.sms <= 0)
    k.sms = 100;
  return true;
}

std::mutex& init_mutex() {
  static std::mutex m;
  return m;
}

bool launch(CUfunction f, dim3 grid, unsigned block, void** args, std::string& why) {
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  // A driver that refuses the attribute gets plain launches from then on.
  static std::atomic<bool> pdl_refused{false};
  if (auto ex = kernels().launch_ex; ex && !pdl_refused.load(std::memory_order_relaxed)) {
    ::CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    ::CUlaunchConfig c{};
    c.gridDimX = grid.x;
    c.gridDimY = grid.y;
    c.gridDimZ = grid.z;
    c.blockDimX = block;
    c.blockDimY = 1;
    c.blockDimZ = 1;
    c.hStream = stream;
    c.attrs = &attr;
    c.numAttrs = 1;
    if (ex(&c, f, args, nullptr) == 0) return true;
    pdl_refused.store(true, std::memory_order_relaxed);
    std::fprintf(stderr, "gyre: programmatic dependent launch refused; launching plainly\n");
  }
  if (int rc = kernels().launch(f, grid.x, grid.y, grid.z, block, 1, 1, 0, stream, args,
                                nullptr)) {
    why = "cuLaunchKernel failed: " + std::to_string(rc);
    return false;
  }
  return true;
}

bool is_bf16_cuda(const at::Tensor& t) {
  return t.is_cuda() && t.scalar_type() == at::kBFloat16 && t.is_contiguous();
}

}  // namespace

extern "C" {

// Compiles the kernels for sm_<arch> without loading them (no GPU needed):
// the CPU machines' tests check the source this way.
int gyre_fused_compile(int arch, char* err, size_t err_len) {
  std::vector<char> cubin;
  std::string why;
  if (!compile(arch, cubin, why)) {
    put(err, err_len, why);
    return 1;
  }
  return cubin.empty() ? (put(err, err_len, "empty cubin"), 1) : 0;
}

// Compiles and loads the kernels for the current device, once; later calls
// return the first call's result.
int gyre_fused_init(char* err, size_t err_len) {
  std::lock_guard<std::mutex> g(init_mutex());
  static bool tried = false;
  auto& k = kernels();
  if (!tried) {
    tried = true;
    try {
      k.ready = init_locked(k, k.why);
    } catch (const std::exception& e) {
      k.why = e.what();
      k.ready = false;
    }
  }
  if (!k.ready) put(err, err_len, k.why);
  return k.ready ? 0 : 1;
}

// x, delta (may be null), x_out (null when delta is), h: [rows, hidden]
// bf16 contiguous CUDA; w: [hidden].
int gyre_fused_add_rms_norm(const at::Tensor* x, const at::Tensor* delta, const at::Tensor* w,
                            const at::Tensor* x_out, const at::Tensor* h, double eps, char* err,
                            size_t err_len) {
  std::string why;
  if (!kernels().ready) {
    put(err, err_len, "fused kernels not loaded");
    return 1;
  }
  if (!is_bf16_cuda(*x) || !is_bf16_cuda(*w) || !is_bf16_cuda(*h) ||
      (delta && (!is_bf16_cuda(*delta) || !x_out || !is_bf16_cuda(*x_out)))) {
    put(err, err_len, "add_rms_norm wants contiguous bf16 CUDA tensors");
    return 1;
  }
  int hidden = static_cast<int>(x->size(-1));
  unsigned rows = static_cast<unsigned>(x->numel() / hidden);
  if (rows == 0) return 0;
  const void* xp = x->data_ptr();
  const void* dp = delta ? delta->data_ptr() : nullptr;
  const void* wp = w->data_ptr();
  void* xo = delta ? x_out->data_ptr() : nullptr;
  void* hp = h->data_ptr();
  float e = static_cast<float>(eps);
  void* args[] = {&xp, &dp, &wp, &xo, &hp, &hidden, &e};
  unsigned block = hidden >= 4096 ? 1024 : (hidden >= 1024 ? 512 : 256);
  if (!launch(kernels().add_rms_norm, rows, block, args, why)) {
    put(err, err_len, why);
    return 1;
  }
  return 0;
}

// qkv [n, (heads + 2 kv_heads) * head_dim], cos and signed sin [n, head_dim]
// (bf16), slots [n] int64, q_out [n, heads, head_dim], k_cache and v_cache
// [slots, kv_heads, head_dim].
int gyre_fused_rope_kv(const at::Tensor* qkv, const at::Tensor* cos, const at::Tensor* ssin,
                       const at::Tensor* slots, const at::Tensor* q_out,
                       const at::Tensor* k_cache, const at::Tensor* v_cache, int64_t heads,
                       int64_t kv_heads, int64_t head_dim, char* err, size_t err_len) {
  std::string why;
  if (!kernels().ready) {
    put(err, err_len, "fused kernels not loaded");
    return 1;
  }
  if (!is_bf16_cuda(*qkv) || !is_bf16_cuda(*cos) || !is_bf16_cuda(*ssin) ||
      !is_bf16_cuda(*q_out) || !is_bf16_cuda(*k_cache) || !is_bf16_cuda(*v_cache) ||
      !slots->is_cuda() || slots->scalar_type() != at::kLong || !slots->is_contiguous()) {
    put(err, err_len, "rope_kv wants contiguous bf16 CUDA tensors and int64 slots");
    return 1;
  }
  unsigned n = static_cast<unsigned>(qkv->size(0));
  if (n == 0) return 0;
  const void* a = qkv->data_ptr();
  const void* c = cos->data_ptr();
  const void* s = ssin->data_ptr();
  const void* sl = slots->data_ptr();
  void* q = q_out->data_ptr();
  void* k = k_cache->data_ptr();
  void* v = v_cache->data_ptr();
  int h = static_cast<int>(heads), kv = static_cast<int>(kv_heads),
      d = static_cast<int>(head_dim);
  void* args[] = {&a, &c, &s, &sl, &q, &k, &v, &h, &kv, &d};
  if (!launch(kernels().rope_kv, n, 256, args, why)) {
    put(err, err_len, why);
    return 1;
  }
  return 0;
}

// gu [n, 2 inter] -> out [n, inter], bf16 contiguous CUDA.
int gyre_fused_silu_mul(const at::Tensor* gu, const at::Tensor* out, char* err, size_t err_len) {
  std::string why;
  if (!kernels().ready) {
    put(err, err_len, "fused kernels not loaded");
    return 1;
  }
  if (!is_bf16_cuda(*gu) || !is_bf16_cuda(*out)) {
    put(err, err_len, "silu_mul wants contiguous bf16 CUDA tensors");
    return 1;
  }
  long n = static_cast<long>(gu->size(0));
  int inter = static_cast<int>(out->size(-1));
  long total = n * inter;
  if (total == 0) return 0;
  const void* g = gu->data_ptr();
  void* o = out->data_ptr();
  void* args[] = {&g, &o, &n, &inter};
  unsigned grid = static_cast<unsigned>((total + 255) / 256);
  if (!launch(kernels().silu_mul, grid, 256, args, why)) {
    put(err, err_len, why);
    return 1;
  }
  return 0;
}

// The device's multiprocessor count (0 before init): the split planner's
// target of blocks.
int gyre_fused_sms() { return kernels().ready ? kernels().sms : 0; }

static bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// y [m, n] = x [m, k] . w [n, k]^T (+ bias [n]), m <= 8, k % 8 == 0, bf16
// contiguous CUDA, x and w 16-byte aligned. w is read before the kernel
// waits for the one before it (programmatic dependent launch): it must not
// be written by a kernel still in flight (model weights are not).
int gyre_fused_gemv(const at::Tensor* x, const at::Tensor* w, const at::Tensor* bias,
                    const at::Tensor* y, char* err, size_t err_len) {
  std::string why;
  if (!kernels().ready) {
    put(err, err_len, "fused kernels not loaded");
    return 1;
  }
  if (!is_bf16_cuda(*x) || !is_bf16_cuda(*w) || !is_bf16_cuda(*y) ||
      (bias && !is_bf16_cuda(*bias)) || x->dim() != 2 || w->dim() != 2 || y->dim() != 2) {
    put(err, err_len, "gemv wants contiguous 2-d bf16 CUDA tensors");
    return 1;
  }
  int64_t m = x->size(0), k = x->size(1), n = w->size(0);
  if (w->size(1) != k || y->size(0) != m || y->size(1) != n || m > 8 || k % 8 != 0 ||
      (bias && bias->numel() != n) || !aligned16(*x) || !aligned16(*w) || n > (1 << 30) ||
      k > (1 << 30)) {
    put(err, err_len, "gemv: shapes or alignment do not fit");
    return 1;
  }
  if (m == 0 || n == 0) return 0;
  const void* xp = x->data_ptr();
  const void* wp = w->data_ptr();
  const void* bp = bias ? bias->data_ptr() : nullptr;
  void* yp = y->data_ptr();
  int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  void* args[] = {&xp, &wp, &bp, &yp, &mi, &ni, &ki};
  int which = m <= 1 ? 0 : (m <= 2 ? 1 : (m <= 4 ? 2 : 3));
  constexpr unsigned warps = 8;
  unsigned grid = static_cast<unsigned>((n + warps - 1) / warps);
  auto& ks = kernels();
  auto f = ks.gemv[which];
  if (which == 0 && ks.gemv_unroll == 8) f = ks.gemv1_u8;
  if (which == 0 && ks.gemv_unroll == 16) f = ks.gemv1_u16;
  if (which == 0 && ks.gemv_split > 1 && k >= ks.gemv_split_min_k) {
    int rows = static_cast<int>(warps) / ks.gemv_split;
    f = ks.gemv1_split[ks.gemv_split == 2 ? 0 : (ks.gemv_split == 4 ? 1 : 2)];
    grid = static_cast<unsigned>((n + rows - 1) / rows);
  }
  if (!launch(f, grid, warps * 32, args, why)) {
    put(err, err_len, why);
    return 1;
  }
  return 0;
}

// y [1, inter] = silu(x . g^T) * (x . u^T) for x [1, k] and the stacked
// w [2 inter, k] (gate rows first), bf16 contiguous CUDA, k % 8 == 0, x
// and w 16-byte aligned; w is read before the kernel waits, as in
// gyre_fused_gemv.
int gyre_fused_gemv_silu(const at::Tensor* x, const at::Tensor* w, const at::Tensor* y,
                         char* err, size_t err_len) {
  std::string why;
  auto& ks = kernels();
  if (!ks.ready) {
    put(err, err_len, "fused kernels not loaded");
    return 1;
  }
  if (!is_bf16_cuda(*x) || !is_bf16_cuda(*w) || !is_bf16_cuda(*y) || x->dim() != 2 ||
      w->dim() != 2 || y->dim() != 2) {
    put(err, err_len, "gemv_silu wants contiguous 2-d bf16 CUDA tensors");
    return 1;
  }
  int64_t k = x->size(1), inter = w->size(0) / 2;
  if (x->size(0) != 1 || w->size(1) != k || w->size(0) != 2 * inter || y->size(0) != 1 ||
      y->size(1) != inter || k % 8 != 0 || !aligned16(*x) || !aligned16(*w) ||
      inter > (1 << 29) || k > (1 << 30)) {
    put(err, err_len, "gemv_silu: shapes or alignment do not fit");
    return 1;
  }
  if (inter == 0) return 0;
  const void* xp = x->data_ptr();
  const void* wp = w->data_ptr();
  void* yp = y->data_ptr();
  int ni = static_cast<int>(inter), ki = static_cast<int>(k);
  void* args[] = {&xp, &wp, &yp, &ni, &ki};
  constexpr unsigned warps = 8;
  unsigned grid = static_cast<unsigned>((inter + warps - 1) / warps);
  auto f = ks.gemv1_silu;
  // The rows split as gyre_fused_gemv splits them (2 or 4 warps; at 8,
  // one warp a row).
  if ((ks.gemv_split == 2 || ks.gemv_split == 4) && k >= ks.gemv_split_min_k) {
    unsigned outs = warps / (2 * ks.gemv_split);
    f = ks.gemv1_silu_split[ks.gemv_split == 2 ? 0 : 1];
    grid = static_cast<unsigned>((inter + outs - 1) / outs);
  }
  if (!launch(f, grid, warps * 32, args, why)) {
    put(err, err_len, why);
    return 1;
  }
  return 0;
}

// Decode attention of q [seqs, heads, head_dim] over the pool's kc, vc
// [slots, kv_heads, head_dim] (bf16) at gather (int64) per cu_k (int32
// [seqs + 1]) and used (int32 [seqs], may be null): out [seqs, heads,
// head_dim]. part (float32, seqs * heads * splits * head_dim) and ml
// (float32, seqs * heads * splits * 2) hold the splits' partial results
// when splits > 1. head_dim 64 or 128, heads / kv_heads <= 8.
int gyre_fused_decode_attention(const at::Tensor* q, const at::Tensor* kc, const at::Tensor* vc,
                                const at::Tensor* gather, const at::Tensor* cu_k,
                                const at::Tensor* used, const at::Tensor* out,
                                const at::Tensor* part, const at::Tensor* ml, int64_t chunk,
                                int64_t splits, double scale, char* err, size_t err_len) {
  std::string why;
  auto& k = kernels();
  if (!k.ready) {
    put(err, err_len, "fused kernels not loaded");
    return 1;
  }
  auto i32 = [](const at::Tensor* t) {
    return t->is_cuda() && t->scalar_type() == at::kInt && t->is_contiguous();
  };
  auto f32 = [](const at::Tensor* t) {
    return t->is_cuda() && t->scalar_type() == at::kFloat && t->is_contiguous();
  };
  if (!is_bf16_cuda(*q) || !is_bf16_cuda(*kc) || !is_bf16_cuda(*vc) || !is_bf16_cuda(*out) ||
      !gather->is_cuda() || gather->scalar_type() != at::kLong || !gather->is_contiguous() ||
      !i32(cu_k) || (used && !i32(used)) || !f32(part) || !f32(ml) || q->dim() != 3 ||
      kc->dim() != 3) {
    put(err, err_len, "decode attention wants bf16 q, pool and out, int64 gather, int32 lengths");
    return 1;
  }
  int64_t seqs = q->size(0), heads = q->size(1), d = q->size(2), kv_heads = kc->size(1);
  if (kc->size(2) != d || vc->sizes() != kc->sizes() || out->sizes() != q->sizes() ||
      (d != 64 && d != 128) || kv_heads <= 0 || heads % kv_heads != 0 ||
      heads / kv_heads > 8 || cu_k->numel() != seqs + 1 || (used && used->numel() != seqs) ||
      chunk <= 0 || splits <= 0 || splits > 65535 || seqs > 65535 ||
      (splits > 1 && (part->numel() < seqs * heads * splits * d ||
                      ml->numel() < seqs * heads * splits * 2))) {
    put(err, err_len, "decode attention: shapes do not fit");
    return 1;
  }
  if (seqs == 0) return 0;
  const void* qp = q->data_ptr();
  const void* kp = kc->data_ptr();
  const void* vp = vc->data_ptr();
  const void* gp = gather->data_ptr();
  const void* cp = cu_k->data_ptr();
  const void* up = used ? used->data_ptr() : nullptr;
  void* op = out->data_ptr();
  void* pp = part->data_ptr();
  void* mp = ml->data_ptr();
  int h = static_cast<int>(heads), kvh = static_cast<int>(kv_heads),
      ch = static_cast<int>(chunk), sp = static_cast<int>(splits);
  float sc = static_cast<float>(scale);
  void* args[] = {&qp, &kp, &vp, &gp, &cp, &up, &op, &pp, &mp, &h, &kvh, &ch, &sc};
  auto split = d == 64 ? k.attn_split64 : k.attn_split128;
  auto combine = d == 64 ? k.attn_combine64 : k.attn_combine128;
  dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(kv_heads),
            static_cast<unsigned>(seqs));
  if (!launch(split, grid, 128, args, why)) {
    put(err, err_len, why);
    return 1;
  }
  if (splits > 1) {
    void* cargs[] = {&pp, &mp, &cp, &up, &op, &h, &sp, &ch};
    if (!launch(combine, dim3(static_cast<unsigned>(heads), static_cast<unsigned>(seqs)),
                static_cast<unsigned>(d), cargs, why)) {
      put(err, err_len, why);
      return 1;
    }
  }
  return 0;
}

}  // extern "C"

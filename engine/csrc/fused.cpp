// Fused CUDA kernels for the decode path: residual add + RMSNorm, rotary
// embedding of the query and key heads + the paged KV write, and SiLU(gate)
// times up. At batch 1 a decode step is weight-bandwidth bound, and each
// small libtorch kernel costs a few microseconds of fixed time; these three
// replace about a dozen of them per layer.
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
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
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
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n * inter) return;
  long r = i / inter;
  int j = (int)(i - r * inter);
  float g = ld(gu[r * 2 * inter + j]);
  float u = ld(gu[r * 2 * inter + inter + j]);
  out[i] = st(rd(g / (1.0f + expf(-g))) * u);
}
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
  CUfunction add_rms_norm = nullptr, rope_kv = nullptr, silu_mul = nullptr;
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
  CUmodule m = nullptr;
  if (int rc = load(&m, cubin.data())) {
    why = "cuModuleLoadData failed: " + std::to_string(rc);
    return false;
  }
  if (get(&k.add_rms_norm, m, "gyre_add_rms_norm") || get(&k.rope_kv, m, "gyre_rope_kv") ||
      get(&k.silu_mul, m, "gyre_silu_mul")) {
    why = "cuModuleGetFunction failed";
    return false;
  }
  return true;
}

std::mutex& init_mutex() {
  static std::mutex m;
  return m;
}

bool launch(CUfunction f, unsigned grid, unsigned block, void** args, std::string& why) {
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  if (int rc = kernels().launch(f, grid, 1, 1, block, 1, 1, 0, stream, args, nullptr)) {
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

}  // extern "C"

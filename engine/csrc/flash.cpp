// gyre's one piece of C++: a C entry point to libtorch's flash attention
// over packed variable-length sequences, which tch does not bind
// (`at::_flash_attention_forward` returns five tensors, some optional).
//
// Tensors cross the boundary as tch does it: pointers to `at::Tensor`.
// Errors are caught here and returned as text, never thrown into Rust.

#include <ATen/core/Tensor.h>
#include <ATen/ops/_flash_attention_forward.h>

#include <cstdint>
#include <cstring>
#include <exception>

extern "C" {

// Flash attention of packed queries `q` [total_q, heads, head_dim] over
// packed keys and values `k`, `v` [total_k, kv_heads, head_dim] (bf16 or
// fp16 on CUDA). Sequence i has queries cu_q[i]..cu_q[i+1] and keys
// cu_k[i]..cu_k[i+1] (int32 on the same device). With `causal`, query j of
// a sequence with Lq queries and Lk keys sees keys 0..=Lk-Lq+j (the queries
// are the sequence's last tokens). `seqused_k` (int32 [sequences], may be
// null): sequence i uses only the first seqused_k[i] of its keys (decode
// graphs pack keys at a fixed stride and pass the real lengths here). On success stores a new tensor
// [total_q, heads, head_dim] in *out and returns 0; otherwise writes the
// error message to `err` (NUL-terminated) and returns 1.
int gyre_flash_varlen(const at::Tensor* q, const at::Tensor* k, const at::Tensor* v,
                      const at::Tensor* cu_q, const at::Tensor* cu_k,
                      const at::Tensor* seqused_k, int64_t max_q, int64_t max_k, double scale,
                      int causal, at::Tensor** out, char* err, size_t err_len) {
  try {
    auto result = at::_flash_attention_forward(*q, *k, *v, *cu_q, *cu_k, max_q, max_k,
                                               /*dropout_p=*/0.0, causal != 0,
                                               /*return_debug_mask=*/false, scale,
                                               /*window_size_left=*/std::nullopt,
                                               /*window_size_right=*/std::nullopt,
                                               seqused_k ? std::optional<at::Tensor>(*seqused_k)
                                                         : std::optional<at::Tensor>());
    *out = new at::Tensor(std::get<0>(result));
    return 0;
  } catch (const std::exception& e) {
    if (err_len > 0) {
      std::strncpy(err, e.what(), err_len - 1);
      err[err_len - 1] = '\0';
    }
    return 1;
  } catch (...) {
    if (err_len > 0) {
      std::strncpy(err, "unknown C++ exception", err_len - 1);
      err[err_len - 1] = '\0';
    }
    return 1;
  }
}

}  // extern "C"

// CUDA graphs for decode steps: C entry points to libtorch's
// `at::cuda::CUDAGraph`, which tch does not bind.
//
// A `GyreGraphs` holds what every graph of one model shares: a side stream
// (graphs must be captured on a stream other than the default one) and one
// memory pool (graphs replay one at a time, and the worker copies a graph's
// output to the host before the next replay, so they may share it).
// Capture runs on the calling thread only (thread-local capture mode), so
// other threads' CUDA calls are not caught up in it.
//
// Errors are caught here and returned as text, never thrown into Rust.

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstring>
#include <exception>
#include <optional>

namespace {

struct GyreGraphs {
  at::cuda::MempoolId_t pool;
  c10::cuda::CUDAStream side;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  GyreGraphs() : pool(at::cuda::graph_pool_handle()), side(c10::cuda::getStreamFromPool()) {}
};

void put(char* err, size_t len, const char* what) {
  if (len > 0) {
    std::strncpy(err, what, len - 1);
    err[len - 1] = '\0';
  }
}

template <typename F>
int guarded(char* err, size_t len, F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    put(err, len, e.what());
  } catch (...) {
    put(err, len, "unknown C++ exception");
  }
  return 1;
}

}  // namespace

extern "C" {

// A graph set for the current CUDA device; fails without one.
int gyre_graphs_new(void** out, char* err, size_t err_len) {
  return guarded(err, err_len, [&] { *out = new GyreGraphs(); });
}

void gyre_graphs_free(void* s) { delete static_cast<GyreGraphs*>(s); }

// Waits for the device, then makes the side stream current on this thread
// (what runs next, warm-up or capture, goes there).
int gyre_graphs_enter(void* s, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* g = static_cast<GyreGraphs*>(s);
    c10::cuda::device_synchronize();
    g->guard.emplace(g->side);
  });
}

// Waits for the device and restores the stream that was current before.
int gyre_graphs_leave(void* s, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* g = static_cast<GyreGraphs*>(s);
    c10::cuda::device_synchronize();
    g->guard.reset();
  });
}

// Starts capturing the current (side) stream into a new graph in the set's pool.
int gyre_graph_begin(void* s, void** out, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* g = static_cast<GyreGraphs*>(s);
    auto* graph = new at::cuda::CUDAGraph();
    try {
      graph->capture_begin(g->pool, cudaStreamCaptureModeThreadLocal);
    } catch (...) {
      delete graph;
      throw;
    }
    *out = graph;
  });
}

// Ends the capture (also after a failed one, so the stream stops capturing).
int gyre_graph_end(void* graph, char* err, size_t err_len) {
  return guarded(err, err_len, [&] { static_cast<at::cuda::CUDAGraph*>(graph)->capture_end(); });
}

// Replays the graph on the current stream.
int gyre_graph_replay(void* graph, char* err, size_t err_len) {
  return guarded(err, err_len, [&] { static_cast<at::cuda::CUDAGraph*>(graph)->replay(); });
}

void gyre_graph_free(void* graph) { delete static_cast<at::cuda::CUDAGraph*>(graph); }

}  // extern "C"

// kvcache/cuda/workspace.h — reusable state of kvcache::cuda::attention calls.
//
// An AttentionWorkspace is what an engine keeps next to its stream so that
// attention calls do no per-call host work beyond planning and the launches:
//   - the split-KV scratch (partial rows and log-sum-exps of the splits),
//     grown on demand to the largest call seen and never shrunk until the
//     workspace is destroyed;
//   - the device's limits (SM count, opt-in shared memory) read once;
//   - per kernel variant, the cudaFuncSetAttribute of its dynamic shared
//     memory and its occupancy (blocks per SM), computed on first use.
// Without a workspace (attention(..., nullptr), the default) each call reads
// the device attributes, sets the attribute, queries the occupancy and, when
// it splits the context, allocates and frees its scratch stream-ordered
// (cudaMallocAsync / cudaFreeAsync): about 50 us of host time per split call
// measured on an H200 (batch 1 x 32k bf16 decode: 120.7 us -> 74.1 us).
//
//   kvcache::cuda::AttentionWorkspace ws;              // the current device
//   for (layer ...) kvcache::cuda::attention(k, v, q, n_q, offsets, out, {}, stream, &ws);
//
// Contract:
//   - A workspace belongs to the device that was current when it was made
//     (device()). Using it while another device is current throws
//     InvalidArgument (checked with cudaGetDevice on every call; nothing is
//     launched).
//   - It serves calls on ONE stream at a time: calls on the same stream reuse
//     the scratch safely because the stream orders them. To use it from
//     another stream, first make that stream wait for the previous one (an
//     event or synchronize()); two streams running calls with one workspace
//     at the same time race on the scratch (wrong results, no error).
//   - Growing the scratch (a call needing more than capacity_bytes())
//     synchronises the call's stream before freeing the old allocation
//     (cudaStreamSynchronize, cudaFree, cudaMalloc): a one-off cost per new
//     high-water mark. Steady-state calls allocate nothing.
//   - Failures: the constructor throws DeviceError when there is no usable
//     device; a failed growth throws DeviceError naming cudaMalloc and the
//     size, and leaves the workspace valid and empty (capacity_bytes() == 0;
//     the next call tries again). A moved-from workspace is empty: passing it
//     to attention throws InvalidArgument; it may be destroyed or assigned to.
//   - Destruction frees the scratch with cudaFree, which waits for work in
//     flight on the device; still, destroy it only after the last call that
//     uses it was enqueued (not concurrently with one).
// Thread-safety: not thread-safe; one thread at a time may pass a given
// workspace to attention (or query it). Different workspaces are independent.
// Outputs are bit-identical with and without a workspace (the same plan and
// kernels run).
#pragma once

#include <cstddef>
#include <memory>

#include "kvcache/cuda/device.h"

namespace kvcache::cuda {

namespace detail {
struct WorkspaceState;  // src/kernels/cuda/attention_internal.h
}  // namespace detail

class AttentionWorkspace {
 public:
  // For the current device; reads its limits. Allocates no device memory.
  // Throws DeviceError (no device / runtime failure).
  AttentionWorkspace();
  ~AttentionWorkspace();
  AttentionWorkspace(AttentionWorkspace&& o) noexcept;
  AttentionWorkspace& operator=(AttentionWorkspace&& o) noexcept;
  AttentionWorkspace(const AttentionWorkspace&) = delete;
  AttentionWorkspace& operator=(const AttentionWorkspace&) = delete;

  // False for a moved-from workspace.
  bool valid() const noexcept { return state_ != nullptr; }
  // The device it was made for; -1 when moved-from.
  int device() const noexcept;
  // Bytes of split scratch currently allocated (0 before the first split
  // call and when moved-from).
  std::size_t capacity_bytes() const noexcept;

  // Internal (the kernels' entry point): the state, nullptr when moved-from.
  detail::WorkspaceState* state() noexcept { return state_.get(); }

 private:
  std::unique_ptr<detail::WorkspaceState> state_;
};

}  // namespace kvcache::cuda

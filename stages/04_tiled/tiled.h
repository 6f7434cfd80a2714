// Stage 04: tiled shared-memory forward, FlashAttention-2 loop order. A thread block owns a tile of
// query rows and streams K/V tiles through shared memory; each K/V element is read from global
// memory once per block instead of once per query row. Tensors are contiguous fp32 on the device:
// q, o [batch, heads_q, seq_q, head_dim]; k, v [batch, heads_kv, seq_kv, head_dim];
// lse [batch, heads_q, seq_q] (may be null).
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage04 {

// 0: the score tile lives in shared memory.
size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// The tiles forward launches at head_dim when a block may use shared_limit bytes of shared memory
// (forward passes flash::shared_memory_limit): 32 query rows and the largest K/V tile, 32 keys or
// 16, that fits. kSharedMemoryTooSmall when even the smallest does not; no CUDA call.
flash::Status forward_tiles(int head_dim, size_t shared_limit, flash::TileShape* tiles);

// O = softmax(scale * Q K^T) V, and each row's log-sum-exp into lse when it is not null; scale is
// usually 1 / sqrt(head_dim). causal = true is refused with kNotSupported.
// workspace may be null (forward_workspace_size is 0).
// Every check runs before any launch, the shared memory the tiles need included (forward_tiles); a
// failed status names the bad argument. On success the work is queued on stream, not finished.
flash::Status forward(const float* q, const float* k, const float* v, float* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage04

// Stage 05: warp-shuffle reductions and register tiles. Each warp owns a band of query rows and
// keeps their scores, running statistics and output accumulators in registers; the row max and sum
// come from __shfl_xor_sync butterflies. Tensors are contiguous fp32 on the device:
// q, o [batch, heads_q, seq_q, head_dim]; k, v [batch, heads_kv, seq_kv, head_dim];
// lse [batch, heads_q, seq_q] (may be null).
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage05 {

// 0: scores live in registers.
size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// The tiles forward launches at head_dim when a block may use shared_limit bytes of shared memory
// (forward passes flash::shared_memory_limit): 64 query rows and the largest K/V tile that fits,
// from 64 keys (32 at head_dim 128) halved down to one that fits in 48 KiB. kSharedMemoryTooSmall
// when even that does not fit; no CUDA call.
flash::Status forward_tiles(int head_dim, size_t shared_limit, flash::TileShape* tiles);

// O = softmax(scale * Q K^T) V, and each row's log-sum-exp into lse when it is not null; scale is
// usually 1 / sqrt(head_dim). causal = true is refused with kNotSupported.
// workspace may be null (forward_workspace_size is 0).
// Every check runs before any launch, the shared memory the tiles need included (forward_tiles); a
// failed status names the bad argument. On success the work is queued on stream, not finished.
flash::Status forward(const float* q, const float* k, const float* v, float* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage05

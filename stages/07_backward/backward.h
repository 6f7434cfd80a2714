// Stage 07: the backward pass, recomputing attention probabilities from the forward's lse instead
// of storing them. The forward is stage 06's (causal or not) and writes lse; the backward takes it
// and returns dQ, dK, dV. Tensors are contiguous fp32 on the device:
// q, o, d_o, dq [batch, heads_q, seq_q, head_dim]; k, v, dk, dv [batch, heads_kv, seq_kv, head_dim];
// lse [batch, heads_q, seq_q]. With GQA, dK and dV of a shared K/V head sum over its query heads.
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage07 {

// 0: the forward keeps everything on chip.
size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// The tiles forward launches at head_dim when a block may use shared_limit bytes of shared memory
// (forward passes flash::shared_memory_limit): 64 query rows and the largest K/V tile that fits,
// from 64 keys (32 at head_dim 128) halved down to one that fits in 48 KiB. kSharedMemoryTooSmall
// when even that does not fit; no CUDA call.
flash::Status forward_tiles(int head_dim, size_t shared_limit, flash::TileShape* tiles);

// Stage 06's forward: O = softmax(scale * Q K^T) V, and each row's log-sum-exp into lse when it is
// not null (backward needs it). scale is usually 1 / sqrt(head_dim).
// causal = true applies the bottom-right aligned mask (flash::causal_key_end); a row that sees no
// key gets O = 0 and lse = -inf. workspace may be null (forward_workspace_size is 0).
// Every check runs before any launch, the shared memory the tiles need included (forward_tiles); a
// failed status names the bad argument. On success the work is queued on stream, not finished.
flash::Status forward(const float* q, const float* k, const float* v, float* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream);

// batch * heads_q * seq_q floats for D = rowsum(dO * O): O(N), never O(N^2).
size_t backward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// The tiles backward launches at head_dim when a block may use shared_limit bytes of shared memory
// (backward passes flash::shared_memory_limit): T query rows and T keys per tile, T the largest of
// 64, 32, 16 that fits, down to one that fits in 48 KiB. kSharedMemoryTooSmall when even that does
// not fit; no CUDA call.
flash::Status backward_tiles(int head_dim, size_t shared_limit, flash::TileShape* tiles);

// dQ, dK, dV from d_o (dO). lse must be the forward's for the same q, k, v, scale and causal, and
// may not be null here. workspace: backward_workspace_size(...) bytes. Checks and status as forward
// (the tiles: backward_tiles).
flash::Status backward(const float* q, const float* k, const float* v, const float* o, const float* lse,
                       const float* d_o, float* dq, float* dk, float* dv, int batch, int heads_q, int heads_kv,
                       int seq_q, int seq_kv, int head_dim, float scale, bool causal, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage07

// Stage 14: the backward pass on Hopper. Stage 11's backward (recompute P from the forward's lse,
// parallel over K/V tiles, dQ added into an fp32 accumulator) on stage 12's instructions: wgmma from
// shared memory and from registers, TMA loads on mbarriers from a producer warp, register
// reallocation, and dQ added by the copy engine (cp.reduce.async.bulk). hopper_backward.cu says how
// the three kernels run.
//
// This stage is a backward only. Its forward is stage 12's (stage12::forward; stage 10's at head_dim
// 32, which stage 12 does not take): the course's registry pairs the two, as it pairs stage 11 with
// stage 10. It reads the lse the forward writes (fp32, natural log, -inf for a row that sees no key);
// any forward that writes the same lse will do.
//
// Tensors are contiguous on the device, q, k, v, o, d_o, dq, dk, dv in `dtype` (fp16 or bf16):
// q, o, d_o, dq [batch, heads_q, seq_q, head_dim]; k, v, dk, dv [batch, heads_kv, seq_kv, head_dim];
// lse [batch, heads_q, seq_q] in fp32. With GQA, dK and dV of a shared K/V head sum over its query
// heads. head_dim 32, 64 or 128 (32 on head_dim 64's tiles, mainloop.cuh's BackwardTiles). Needs
// compute capability 9.0 exactly and a build that includes sm_90a code (CMAKE_CUDA_ARCHITECTURES with
// 90).
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage14 {

// The workspace one backward call needs, in bytes: per query row (seq_q rounded up to 128 per head),
// its base-2 lse and D (4 bytes each) and the fp32 dQ accumulator (head_dim floats, 64 at head_dim
// 32), then one counter per query tile of 64 rows for the deterministic mode. O(N): about batch *
// heads_q * seq_q * (head_dim + 2) * 4 bytes. 0 for sizes < 1.
size_t backward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// Whether this build and this GPU can run the stage: success, or kArchNotSupported naming the GPU
// (any GPU but compute capability 9.0, or a build without sm_90a code, whatever the GPU), or the CUDA
// error that kept it from asking. backward() calls it after its argument checks.
flash::Status check_gpu();

// The dynamic shared memory of the main kernel's block at head_dim, in bytes; 0 for a head_dim this
// stage does not take.
size_t backward_shared_bytes(int head_dim);

// dQ, dK, dV from d_o (dO), given the forward's O and lse for the same q, k, v, scale and causal.
// deterministic = false (the default of the course's APIs): dQ's adds from different K/V tiles land
// in the order the blocks reach them, so dQ may differ in its last bits between two runs on the same
// inputs (dK and dV never do). deterministic = true: each query tile's adds go in key-tile order, and
// the same inputs give the same bits. workspace: backward_workspace_size(...) bytes, 16-byte aligned.
// Every check (the pointers, the sizes, the dtype, head_dim, the workspace, the GPU) runs before any
// launch; a failed status names the bad argument. On success the work is queued on stream.
flash::Status backward(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* d_o,
                       void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv,
                       int head_dim, float scale, bool causal, flash::DType dtype, bool deterministic,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage14

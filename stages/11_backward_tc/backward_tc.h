// Stage 11: the backward pass on the tensor cores. Stage 07's backward by recomputation, in fp16 or
// bf16 with mma.sync m16n8k16 and fp32 accumulation, parallel over K/V tiles with dQ accumulated by
// atomic adds into an fp32 workspace (or, with deterministic = true, by a second pass over query
// tiles without atomics).
//
// This stage is a backward only. Its forward is stage 10's (stage10::forward): the course's registry
// pairs the two, so that this folder needs nothing but flash_stage.cuh and tensor_core.cuh. The
// backward reads the lse that stage 10 writes (fp32, natural log, -inf for a row that sees no key);
// any forward that writes the same lse will do.
//
// Tensors are contiguous on the device, q, k, v, o, d_o, dq, dk, dv in `dtype` (fp16 or bf16):
// q, o, d_o, dq [batch, heads_q, seq_q, head_dim]; k, v, dk, dv [batch, heads_kv, seq_kv, head_dim];
// lse [batch, heads_q, seq_q] in fp32. With GQA, dK and dV of a shared K/V head sum over its query
// heads. Needs compute capability 8.0 or newer.
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage11 {

// The workspace one backward call needs, in bytes: D = rowsum(dO o O), one fp32 per query row
// (rounded up to 16 bytes), then the fp32 dQ accumulator, head_dim floats per query row, seq_q
// rounded up to a multiple of 128 (the accumulator holds whole query tiles). O(N):
// batch * heads_q * seq_q * (head_dim + 1) * 4 bytes, give or take the rounding. The deterministic
// mode uses only the first part, but the size is the same for both modes. 0 for sizes < 1.
size_t backward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// The dynamic shared memory, in bytes, that one backward call at head_dim needs at least: the largest
// block it launches (the K/V-tile kernel; with deterministic, also the query-tile kernel) with 64 query
// rows per step. 0 for a head_dim this stage does not take. backward refuses, before any launch, a GPU
// whose shared memory per block (flash::shared_memory_limit) is smaller.
size_t backward_shared_bytes(int head_dim, bool deterministic);

// The query rows per step (Br) of the K/V-tile kernel at head_dim when a block may use shared_limit
// bytes: 128 at head_dim 64 where their 162 KiB fit (an A100, an H100), 64 otherwise; 0 for a head_dim
// this stage does not take. No CUDA call: backward passes flash::shared_memory_limit.
int backward_step_rows(int head_dim, size_t shared_limit);

// Whether the default mode adds dQ's shares through shared memory and the copy engine
// (cp.reduce.async.bulk, compute capability 9.0 on: `compute_capability` is 10 * major + minor) rather
// than by red.global.add from registers: where the K/V-tile kernel's block, with backward_step_rows's
// rows, still fits shared_limit bytes with one query tile's share of dQ in fp32 (Br * head_dim * 4
// bytes) beside it. No CUDA call.
bool backward_bulk_dq(int head_dim, int compute_capability, size_t shared_limit);

// dQ, dK, dV from d_o (dO), given the forward's O and lse (which may not be null here) for the same
// q, k, v, scale and causal. dtype is kFp16 or kBf16 (anything else: kDtypeNotSupported).
// deterministic = false (the default of the course's APIs): dQ is summed with fp32 atomic adds, whose
// order changes from run to run, so dQ may differ in its last bits between two runs on the same
// inputs (dK and dV never do). deterministic = true: the same inputs give the same bits, at the price
// of a second pass that recomputes S, P and dP for dQ (lesson 11 measures it).
// workspace: backward_workspace_size(...) bytes, 16-byte aligned. Every check (the pointers, the
// sizes, the dtype, the workspace, the GPU's compute capability and shared memory) runs before any
// launch; a failed status names the bad argument. On success the work is queued on stream.
flash::Status backward(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* d_o,
                       void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv,
                       int head_dim, float scale, bool causal, flash::DType dtype, bool deterministic,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage11

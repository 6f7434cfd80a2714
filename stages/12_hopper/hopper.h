// Stage 12: Hopper. The FlashAttention forward on the instructions that only compute capability 9.0
// has: wgmma (asynchronous warpgroup matrix multiply from shared memory), TMA (cp.async.bulk.tensor
// with mbarrier transaction counts), a producer that loads while consumer warpgroups compute, and
// register reallocation between them (setmaxnreg). hopper.cu says which of its two kernels runs where.
// Tensors are contiguous on the device,
// q, k, v, o in `dtype` (fp16 or bf16):
// q, o [batch, heads_q, seq_q, head_dim]; k, v [batch, heads_kv, seq_kv, head_dim];
// lse [batch, heads_q, seq_q] in fp32 (may be null). head_dim 64 or 128. Needs compute capability
// 9.0 exactly and a build that includes sm_90a code (CMAKE_CUDA_ARCHITECTURES with 90).
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage12 {

// 0: scores live in registers.
size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// Whether this build and this GPU can run the stage: success, or kArchNotSupported naming the GPU
// (any GPU but compute capability 9.0, or a build without sm_90a code, whatever the GPU), or the CUDA
// error that kept it from asking. forward() calls it after its argument checks.
flash::Status check_gpu();

// O = softmax(scale * Q K^T) V, and each row's log-sum-exp into lse when it is not null; scale is
// usually 1 / sqrt(head_dim). causal = true applies the bottom-right aligned mask
// (flash::causal_key_end); a row that sees no key gets O = 0 and lse = -inf. dtype is kFp16 or
// kBf16 (anything else: kDtypeNotSupported); head_dim 64 or 128 (anything else:
// kHeadDimNotSupported). workspace may be null (forward_workspace_size is 0). Every check runs
// before any launch; a failed status names the bad argument. On success the work is queued on
// stream, not finished.
flash::Status forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, flash::DType dtype,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage12

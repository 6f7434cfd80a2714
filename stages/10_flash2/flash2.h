// Stage 10: FlashAttention-2. Stage 09 tuned the way the production kernel is: exp2 with
// log2(e) in the scale, a tile shape per head_dim, and the longest causal query tiles first.
// Tensors are contiguous on the device, q, k, v, o in `dtype` (fp16 or bf16):
// q, o [batch, heads_q, seq_q, head_dim]; k, v [batch, heads_kv, seq_kv, head_dim];
// lse [batch, heads_q, seq_q] in fp32 (may be null). Needs compute capability 8.0 or newer.
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage10 {

// 0: scores live in registers.
size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// O = softmax(scale * Q K^T) V, and each row's log-sum-exp into lse when it is not null; scale is
// usually 1 / sqrt(head_dim). causal = true applies the bottom-right aligned mask
// (flash::causal_key_end); a row that sees no key gets O = 0 and lse = -inf. dtype is kFp16 or
// kBf16 (anything else: kDtypeNotSupported). workspace may be null (forward_workspace_size is 0).
// Every check runs before any launch; a failed status names the bad argument. On success the work
// is queued on stream, not finished.
flash::Status forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, flash::DType dtype,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage10

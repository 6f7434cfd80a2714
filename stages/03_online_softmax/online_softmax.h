// Stage 03: online softmax. One fused kernel, one thread per query row, one pass over the keys;
// no score matrix, so no workspace. Tensors are contiguous fp32 on the device:
// q, o [batch, heads_q, seq_q, head_dim]; k, v [batch, heads_kv, seq_kv, head_dim];
// lse [batch, heads_q, seq_q] (may be null).
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage03 {

// 0: the scores never leave registers.
size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// O = softmax(scale * Q K^T) V, and each row's log-sum-exp into lse when it is not null; scale is
// usually 1 / sqrt(head_dim). causal = true is refused with kNotSupported.
// workspace may be null (forward_workspace_size is 0).
// Every check runs before any launch; a failed status names the bad argument. On success the work
// is queued on stream, not finished.
flash::Status forward(const float* q, const float* k, const float* v, float* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage03

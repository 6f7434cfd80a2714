// Stage 02: safe softmax. The pipeline of stage 01 (scores in the workspace, softmax in place,
// then times V) with the row max subtracted before exp, so no score can overflow. Tensors are
// contiguous fp32 on the device: q, o [batch, heads_q, seq_q, head_dim]; k, v [batch, heads_kv, seq_kv,
// head_dim]; lse [batch, heads_q, seq_q] (may be null).
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage02 {

// batch * heads_q * seq_q * seq_kv floats: still the N^2 score matrix; stage 03 removes it.
size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// O = softmax(scale * Q K^T) V, and each row's log-sum-exp into lse when it is not null; scale is
// usually 1 / sqrt(head_dim). causal = true is refused with kNotSupported.
// workspace: forward_workspace_size(...) bytes.
// Every check runs before any launch; a failed status names the bad argument. On success the work
// is queued on stream, not finished.
flash::Status forward(const float* q, const float* k, const float* v, float* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage02

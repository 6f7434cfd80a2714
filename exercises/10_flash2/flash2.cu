// Stage 10: FlashAttention-2. The kernel and what changed from stage 09 are in flash2_kernel.cuh;
// this file chooses its tile shape per head_dim, from the measurements in the lesson.
#include "flash2.h"

#include "flash2_kernel.cuh"

namespace stage10 {
namespace {

constexpr int kMinComputeCapability = 80;  // mma.sync with bf16, ldmatrix, cp.async (sm_80)

// One shape per head_dim (TileConfig<warps, rows per warp, keys per tile, Q in registers, blocks per
// SM, lazy rescale>), chosen from bench/stage10_variants.cu's runs on the H100 (lesson 10's table).
using Config32 = TileConfig<4, 32, 64, true, 2>;
using Config64 = TileConfig<4, 32, 64, true, 2>;
using Config128 = TileConfig<4, 32, 64, false, 1, true>;

template <typename Element>
flash::Status launch_for_head_dim(const void* q, const void* k, const void* v, void* o, float* lse, int batch,
                                  int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                                  bool causal, cudaStream_t stream) {
  switch (head_dim) {
    case 32:
      return launch_flash2<Element, 32, Config32>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale,
                                                  causal, stream);
    case 64:
      return launch_flash2<Element, 64, Config64>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale,
                                                  causal, stream);
    default:
      return launch_flash2<Element, 128, Config128>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale,
                                                    causal, stream);
  }
}

}  // namespace

size_t forward_workspace_size(int, int, int, int, int, int) { return 0; }

flash::Status forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, flash::DType dtype,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  flash::Status status =
      flash::check_forward_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale);
  if (status.ok()) status = flash::check_half_dtype(dtype);
  if (status.ok()) status = flash::check_workspace(workspace, workspace_bytes, 0);
  if (status.ok()) status = flash::check_compute_capability(kMinComputeCapability);
  if (!status.ok()) return status;
  if (dtype == flash::DType::kFp16)
    return launch_for_head_dim<__half>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                       causal, stream);
  return launch_for_head_dim<__nv_bfloat16>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                            causal, stream);
}

}  // namespace stage10

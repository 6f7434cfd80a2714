// Stage 11: the tensor-core backward. The kernels and the products they compute are in
// backward_tc_kernel.cuh; this file checks the arguments, chooses the tile shapes per head_dim and GPU,
// lays out the workspace and launches the kernels in order.
#include "backward_tc.h"

#include <algorithm>

#include "backward_tc_kernel.cuh"

namespace stage11 {
namespace {

constexpr int kMinComputeCapability = 80;   // mma.sync with bf16, ldmatrix, cp.async (sm_80)
constexpr int kBulkComputeCapability = 90;  // cp.reduce.async.bulk (sm_90)
constexpr int kRowDotThreads = 256;         // row_dot_kernel and convert_dq_kernel

// dk_dv_kernel: KeyTileConfig<warps, query rows per step, blocks per SM>, 128 keys per block as
// FlashAttention-2's backward; the registers it takes leave one block per SM. dq_kernel (deterministic
// mode): QueryTileConfig<warps (16 rows each), keys per tile, blocks per SM>.
// Query rows per step: 64 at every head_dim, the shape every GPU from sm_80 up runs (161 KiB of shared
// memory at head_dim 128, so there only an A100 or an H100). At head_dim 64, 128 rows where the GPU's
// shared memory holds them (162 KiB: an A100, an H100; 64 rows take 97 KiB, within an RTX 30/40
// card's 99): per query row, half the barriers and prefetches, and each warp's S and dP tile twice as
// tall for the same K and V fragments (lesson 11 measured 1.00-1.10x on the H100). At head_dim 128, 128
// rows would take 256 KiB, and 64 rows spill a few dozen bytes per thread (-Xptxas -v) yet measured
// faster than 32 rows, which pay a barrier and a prefetch twice as often per query row (lesson 11).
template <int kBlockRows>
using KeyTileWithRows = KeyTileConfig<8, kBlockRows, 1>;
constexpr int kStepRows = 64;      // query rows per step, every head_dim and every GPU
constexpr int kWideStepRows = 128;  // at head_dim 64, where shared memory allows
using QueryTile = QueryTileConfig<4, 64, 1>;

template <typename Element, int kHeadDim, int kBlockRows>
constexpr size_t key_tile_shared_bytes() {
  return sizeof(kernel_detail::KeyTileShared<Element, kHeadDim, KeyTileWithRows<kBlockRows>>);
}

// DqMode::kBulkAdd's staging buffers, one query tile's share of dQ in fp32 (after the tiles).
template <int kHeadDim, int kBlockRows>
constexpr size_t dq_staging_bytes() {
  return sizeof(float) * kernel_detail::DqShare<kHeadDim, KeyTileWithRows<kBlockRows>>::kTileFloats;
}

template <typename Element, int kHeadDim>
constexpr size_t query_tile_shared_bytes() {
  return sizeof(kernel_detail::QueryTileShared<Element, kHeadDim, QueryTile>);
}

// Bytes of the D part of the workspace: one float per row, rounded up to 16 bytes so that the dQ
// accumulator after it starts aligned for float4.
size_t d_bytes(long long rows) { return (static_cast<size_t>(rows) * sizeof(float) + 15) / 16 * 16; }

// Whether a block of the K/V-tile kernel with kBlockRows rows per step and DqMode::kBulkAdd's staging
// buffers fits shared_limit bytes.
template <int kHeadDim, int kBlockRows>
bool staging_fits(size_t shared_limit) {
  return shared_limit >= key_tile_shared_bytes<__half, kHeadDim, kBlockRows>() + dq_staging_bytes<kHeadDim, kBlockRows>();
}

// The K/V-tile kernel for causal and the dQ mode (one instance per pair).
template <typename Element, int kHeadDim, class KeyTile, bool kCausal>
auto key_tile_kernel(DqMode mode) {
  switch (mode) {
    case DqMode::kSecondPass: return dk_dv_kernel<Element, kHeadDim, kCausal, DqMode::kSecondPass, KeyTile>;
    case DqMode::kRedAdd: return dk_dv_kernel<Element, kHeadDim, kCausal, DqMode::kRedAdd, KeyTile>;
    default: return dk_dv_kernel<Element, kHeadDim, kCausal, DqMode::kBulkAdd, KeyTile>;
  }
}

// The least shared memory a call at kHeadDim needs: the 64-row step's. The shapes do not depend on the
// dtype: both 16-bit types give the same sizes.
template <int kHeadDim>
size_t shared_bytes_for(bool deterministic) {
  const size_t key_tile = key_tile_shared_bytes<__half, kHeadDim, kStepRows>();
  const size_t query_tile = deterministic ? query_tile_shared_bytes<__half, kHeadDim>() : 0;
  return key_tile > query_tile ? key_tile : query_tile;
}

template <typename Element, int kHeadDim, int kBlockRows>
flash::Status launch(const Element* q, const Element* k, const Element* v, const Element* o, const float* lse,
                     const Element* d_o, Element* dq, Element* dk, Element* dv, int batch, int heads_q, int heads_kv,
                     int seq_q, int seq_kv, float scale, bool causal, bool deterministic, bool bulk_dq,
                     void* workspace, cudaStream_t stream) {
  using KeyTile = KeyTileWithRows<kBlockRows>;
  const long long rows = static_cast<long long>(batch) * heads_q * seq_q;
  const int num_q_tiles = (seq_q + kBlockRows - 1) / kBlockRows;
  // The accumulator in DqShare's layout: whole query tiles of every head.
  const long long accum_floats = static_cast<long long>(batch) * heads_q * num_q_tiles * kBlockRows * kHeadDim;
  float* d_rows = static_cast<float*>(workspace);
  float* dq_accum = deterministic ? nullptr
                                  : reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + d_bytes(rows));
  const float scale_log2 = scale * kernel_detail::kLog2e;

  // The kernels of this call, and the shared memory each block takes (opted into before any launch).
  const DqMode mode = deterministic ? DqMode::kSecondPass : bulk_dq ? DqMode::kBulkAdd : DqMode::kRedAdd;
  const auto dk_dv = causal ? key_tile_kernel<Element, kHeadDim, KeyTile, true>(mode)
                            : key_tile_kernel<Element, kHeadDim, KeyTile, false>(mode);
  const size_t dk_dv_bytes = key_tile_shared_bytes<Element, kHeadDim, kBlockRows>() +
                             (mode == DqMode::kBulkAdd ? dq_staging_bytes<kHeadDim, kBlockRows>() : 0);
  const auto dq_pass = causal ? dq_kernel<Element, kHeadDim, true, QueryTile>
                              : dq_kernel<Element, kHeadDim, false, QueryTile>;
  constexpr size_t kDqBytes = query_tile_shared_bytes<Element, kHeadDim>();
  flash::Status status = flash::allow_shared_memory(dk_dv, dk_dv_bytes);
  if (status.ok() && deterministic) status = flash::allow_shared_memory(dq_pass, kDqBytes);
  if (!status.ok()) return status;

  // 1. D, and (default mode) the accumulator zeroed.
  constexpr int kLanesPerRow = kHeadDim / kernel_detail::kVecElems;
  const long long accum_vectors = deterministic ? 0 : accum_floats / kernel_detail::kVecElems;
  const long long row_dot_threads = std::max(rows * kLanesPerRow, accum_vectors);
  const long long row_dot_blocks = (row_dot_threads + kRowDotThreads - 1) / kRowDotThreads;
  row_dot_kernel<Element, kHeadDim><<<static_cast<unsigned>(row_dot_blocks), kRowDotThreads, 0, stream>>>(
      d_o, o, d_rows, rows, dq_accum, accum_vectors);
  if (!(status = flash::last_launch_status()).ok()) return status;

  // 2. dK, dV (and dQ's shares): one block per K/V tile of each K/V head.
  const int num_k_tiles = (seq_kv + KeyTile::kBlockCols - 1) / KeyTile::kBlockCols;
  const long long dk_dv_blocks = static_cast<long long>(batch) * heads_kv * num_k_tiles;
  dk_dv<<<static_cast<unsigned>(dk_dv_blocks), KeyTile::kWarps * 32, dk_dv_bytes, stream>>>(
      q, k, v, d_o, lse, d_rows, dq_accum, dk, dv, heads_q, heads_kv, seq_q, seq_kv, scale, scale_log2, num_k_tiles);
  if (!(status = flash::last_launch_status()).ok()) return status;

  if (!deterministic) {
    // 3a. dQ from the accumulator.
    const long long float4s = accum_floats / 4;
    const long long blocks = (float4s + kRowDotThreads - 1) / kRowDotThreads;
    convert_dq_kernel<Element, kHeadDim, KeyTile><<<static_cast<unsigned>(blocks), kRowDotThreads, 0, stream>>>(
        dq_accum, dq, float4s, seq_q, num_q_tiles, scale);
    return flash::last_launch_status();
  }
  // 3b. dQ by a second pass over query tiles.
  const int num_dq_tiles = (seq_q + QueryTile::kBlockRows - 1) / QueryTile::kBlockRows;
  const int num_heads_total = batch * heads_q;
  const long long dq_blocks = static_cast<long long>(num_heads_total) * num_dq_tiles;
  dq_pass<<<static_cast<unsigned>(dq_blocks), QueryTile::kWarps * 32, kDqBytes, stream>>>(
      q, k, v, d_o, lse, d_rows, dq, heads_q, heads_kv, seq_q, seq_kv, scale, scale_log2, num_dq_tiles,
      num_heads_total);
  return flash::last_launch_status();
}

template <typename Element>
flash::Status launch_for_head_dim(const void* q, const void* k, const void* v, const void* o, const float* lse,
                                  const void* d_o, void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv,
                                  int seq_q, int seq_kv, int head_dim, float scale, bool causal, bool deterministic,
                                  void* workspace, cudaStream_t stream) {
  const auto* q_ = static_cast<const Element*>(q);
  const auto* k_ = static_cast<const Element*>(k);
  const auto* v_ = static_cast<const Element*>(v);
  const auto* o_ = static_cast<const Element*>(o);
  const auto* d_o_ = static_cast<const Element*>(d_o);
  auto* dq_ = static_cast<Element*>(dq);
  auto* dk_ = static_cast<Element*>(dk);
  auto* dv_ = static_cast<Element*>(dv);
  size_t limit = 0;
  int cc = 0;
  flash::Status status = flash::shared_memory_limit(&limit);
  if (status.ok()) status = flash::compute_capability(&cc);
  if (!status.ok()) return status;
  const bool bulk = !deterministic && backward_bulk_dq(head_dim, cc, limit);
  switch (head_dim) {
    case 32:
      return launch<Element, 32, kStepRows>(q_, k_, v_, o_, lse, d_o_, dq_, dk_, dv_, batch, heads_q, heads_kv, seq_q,
                                            seq_kv, scale, causal, deterministic, bulk, workspace, stream);
    case 64:
      if (backward_step_rows(64, limit) == kWideStepRows)
        return launch<Element, 64, kWideStepRows>(q_, k_, v_, o_, lse, d_o_, dq_, dk_, dv_, batch, heads_q, heads_kv,
                                                  seq_q, seq_kv, scale, causal, deterministic, bulk, workspace,
                                                  stream);
      return launch<Element, 64, kStepRows>(q_, k_, v_, o_, lse, d_o_, dq_, dk_, dv_, batch, heads_q, heads_kv, seq_q,
                                            seq_kv, scale, causal, deterministic, bulk, workspace, stream);
    default:
      return launch<Element, 128, kStepRows>(q_, k_, v_, o_, lse, d_o_, dq_, dk_, dv_, batch, heads_q, heads_kv, seq_q,
                                             seq_kv, scale, causal, deterministic, bulk, workspace, stream);
  }
}

}  // namespace

size_t backward_workspace_size(int batch, int heads_q, int /*heads_kv*/, int seq_q, int /*seq_kv*/, int head_dim) {
  if (batch < 1 || heads_q < 1 || seq_q < 1 || head_dim < 1) return 0;
  const long long rows = static_cast<long long>(batch) * heads_q * seq_q;
  // The accumulator holds whole query tiles (DqShare): seq_q rounded up to the widest step's rows,
  // which covers every step's.
  const long long padded_rows =
      static_cast<long long>(batch) * heads_q * ((seq_q + kWideStepRows - 1) / kWideStepRows) * kWideStepRows;
  return d_bytes(rows) + static_cast<size_t>(padded_rows) * head_dim * sizeof(float);
}

size_t backward_shared_bytes(int head_dim, bool deterministic) {
  switch (head_dim) {
    case 32: return shared_bytes_for<32>(deterministic);
    case 64: return shared_bytes_for<64>(deterministic);
    case 128: return shared_bytes_for<128>(deterministic);
    default: return 0;
  }
}

int backward_step_rows(int head_dim, size_t shared_limit) {
  if (head_dim != 32 && head_dim != 64 && head_dim != 128) return 0;
  const bool wide = head_dim == 64 && shared_limit >= key_tile_shared_bytes<__half, 64, kWideStepRows>();
  return wide ? kWideStepRows : kStepRows;
}

bool backward_bulk_dq(int head_dim, int compute_capability, size_t shared_limit) {
  if (compute_capability < kBulkComputeCapability) return false;
  switch (head_dim) {
    case 32: return staging_fits<32, kStepRows>(shared_limit);
    case 64:
      return backward_step_rows(64, shared_limit) == kWideStepRows ? staging_fits<64, kWideStepRows>(shared_limit)
                                                                   : staging_fits<64, kStepRows>(shared_limit);
    case 128: return staging_fits<128, kStepRows>(shared_limit);
    default: return false;
  }
}

flash::Status backward(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* d_o,
                       void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv,
                       int head_dim, float scale, bool causal, flash::DType dtype, bool deterministic,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  flash::Status status =
      flash::check_forward_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale);
  if (!status.ok()) return status;
  const struct {
    const void* ptr;
    const char* name;
  } gradients[] = {{lse, "lse"}, {d_o, "d_o"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"}};
  for (const auto& g : gradients) {
    if (!g.ptr) return flash::make_status(flash::StatusCode::kNullPointer, g.name, 0);
    if (!flash::aligned(g.ptr)) return flash::make_status(flash::StatusCode::kMisalignedPointer, g.name, 0);
  }
  status = flash::check_half_dtype(dtype);
  if (status.ok())
    status = flash::check_workspace(workspace, workspace_bytes,
                                    backward_workspace_size(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim));
  if (status.ok()) status = flash::check_compute_capability(kMinComputeCapability);
  if (status.ok()) status = flash::check_shared_memory(backward_shared_bytes(head_dim, deterministic));
  if (!status.ok()) return status;
  if (dtype == flash::DType::kFp16)
    return launch_for_head_dim<__half>(q, k, v, o, lse, d_o, dq, dk, dv, batch, heads_q, heads_kv, seq_q, seq_kv,
                                       head_dim, scale, causal, deterministic, workspace, stream);
  return launch_for_head_dim<__nv_bfloat16>(q, k, v, o, lse, d_o, dq, dk, dv, batch, heads_q, heads_kv, seq_q, seq_kv,
                                            head_dim, scale, causal, deterministic, workspace, stream);
}

}  // namespace stage11

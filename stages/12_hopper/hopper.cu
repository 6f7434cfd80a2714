// Stage 12: Hopper. This file checks the arguments and the GPU, makes the TMA tensor maps, and
// chooses between the stage's two kernels: in_order_kernel.cuh (head_dim 64 without the mask) and
// pingpong_kernel.cuh (everything else). Read them in that order, after tile_scheduler.cuh (the work
// order), mainloop.cuh (what both kernels share) and epilogue.cuh (the output).
//
// Built two ways (CMakeLists.txt): for sm_90a, with FLASH_STAGE12_SM90A defined, when the configured
// CUDA architectures include Hopper; otherwise as a stub that refuses every call with
// kArchNotSupported, so that the project still builds and runs everywhere else.
#include "hopper.h"

#if defined(FLASH_STAGE12_SM90A)
#include <algorithm>

#include "in_order_kernel.cuh"
#include "pingpong_kernel.cuh"
#include "tensor_map.h"
#endif

namespace stage12 {
namespace {

// The one compute capability whose code this stage carries: sm_90a instructions (wgmma, setmaxnreg)
// run on 9.0 and nowhere else, not even on later GPUs (PTX ISA, "Target ISA notes": "Requires sm_90a").
constexpr int kHopper = 90;

// The shared check's head_dim message lists 32, which this stage does not take.
flash::Status with_own_head_dims(flash::Status s) {
  return s.code == flash::StatusCode::kHeadDimNotSupported ? flash::with_detail(s, "64, 128") : s;
}

flash::Status check_args(const void* q, const void* k, const void* v, const void* o, const float* lse, int batch,
                         int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                         flash::DType dtype, const void* workspace, size_t workspace_bytes) {
  flash::Status status = with_own_head_dims(
      flash::check_forward_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale));
  if (status.ok() && head_dim != 64 && head_dim != 128)
    status = flash::with_detail(flash::make_status(flash::StatusCode::kHeadDimNotSupported, "head_dim", head_dim),
                                "64, 128");
  if (status.ok()) status = flash::check_half_dtype(dtype);
  if (status.ok()) status = flash::check_workspace(workspace, workspace_bytes, 0);
  if (status.ok()) status = check_gpu();
  return status;
}

#if defined(FLASH_STAGE12_SM90A)

// ---------------------------------------------------------------------------------------------
// TMA tensor maps
// ---------------------------------------------------------------------------------------------

// A 3-D TMA map over a [heads_total, seq, head_dim] tensor in boxes of one 64-column panel by box_rows
// rows (tensor_map.h says what each field of the map is).
flash::Status make_tensor_map(CUtensorMap* map, const void* base, flash::DType dtype, int head_dim, int seq,
                              long long heads_total, int box_rows) {
  return tensor_map::make_3d(map, base, dtype, head_dim, seq, heads_total, kPanelCols, box_rows);
}

// ---------------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------------

// One call's arguments, as forward() took them (checked).
struct Launch {
  const void *q, *k, *v;
  void* o;
  float* lse;
  int batch, heads_q, heads_kv, seq_q, seq_kv, head_dim;
  float scale;
  bool causal;
  flash::DType dtype;
  cudaStream_t stream;
};

// What both kernels know of the problem besides the tensors; the softmax's scale in base 2.
ProblemShape problem_shape(const Launch& a) {
  return ProblemShape{a.heads_kv, a.seq_q, a.seq_kv, a.scale * kLog2e, make_grid_divisor(a.heads_q),
                      make_grid_divisor(a.heads_q / a.heads_kv)};
}

// The tensor maps of Q, K and V (the batch and head dimensions flattened: make_tensor_map): Q in boxes
// of one consumer warpgroup's 64 rows, K and V in boxes of one K/V tile.
flash::Status make_qkv_maps(const Launch& a, int block_cols, CUtensorMap* q_map, CUtensorMap* k_map,
                            CUtensorMap* v_map) {
  const long long heads_total_q = static_cast<long long>(a.batch) * a.heads_q;
  const long long heads_total_kv = static_cast<long long>(a.batch) * a.heads_kv;
  flash::Status status = make_tensor_map(q_map, a.q, a.dtype, a.head_dim, a.seq_q, heads_total_q, kWgmmaM);
  if (status.ok()) status = make_tensor_map(k_map, a.k, a.dtype, a.head_dim, a.seq_kv, heads_total_kv, block_cols);
  if (status.ok()) status = make_tensor_map(v_map, a.v, a.dtype, a.head_dim, a.seq_kv, heads_total_kv, block_cols);
  return status;
}

template <class Kernel>
flash::Status prepare_kernel(Kernel kernel, size_t shared_bytes) {
  flash::Status status = flash::check_shared_memory(shared_bytes);
  if (status.ok()) status = flash::allow_shared_memory(kernel, shared_bytes);
  return status;
}

// head_dim 64 without the mask: in_order_kernel, a block per query tile of 64 rows.
template <typename Element>
flash::Status launch_in_order(const Launch& a) {
  const auto kernel = in_order_kernel<Element>;
  constexpr size_t kSharedBytes = SharedLayout<kInOrderHeadDim, InOrderTiles>::kDynamicBytes;
  flash::Status status = prepare_kernel(kernel, kSharedBytes);
  CUtensorMap q_map, k_map, v_map;
  if (status.ok()) status = make_qkv_maps(a, InOrderTiles::kBlockCols, &q_map, &k_map, &v_map);
  if (!status.ok()) return status;
  const int num_q_tiles = (a.seq_q + InOrderTiles::kBlockRows - 1) / InOrderTiles::kBlockRows;
  const ScheduledGrid grid = block_per_tile_schedule(a.batch * a.heads_q, num_q_tiles);
  kernel<<<static_cast<unsigned>(grid.blocks), kInOrderThreads, kSharedBytes, a.stream>>>(
      q_map, k_map, v_map, static_cast<Element*>(a.o), a.lse, problem_shape(a), grid.schedule);
  return flash::last_launch_status();
}

// Every other shape: pingpong_kernel, persistent, with kBlockCols keys a K/V tile.
template <typename Element, int kHeadDim, bool kCausal, int kBlockCols>
flash::Status launch_pingpong(const Launch& a) {
  using Shape = PingPongTiles<kBlockCols>;
  const auto kernel = pingpong_kernel<Element, kHeadDim, kCausal, Shape>;
  constexpr size_t kSharedBytes = SharedLayout<kHeadDim, Shape>::kDynamicBytes;
  flash::Status status = prepare_kernel(kernel, kSharedBytes);
  CUtensorMap q_map, k_map, v_map, o_map;
  if (status.ok()) status = make_qkv_maps(a, kBlockCols, &q_map, &k_map, &v_map);
  // O has Q's shape; each consumer warpgroup stores its 64 rows.
  if (status.ok())
    status = make_tensor_map(&o_map, a.o, a.dtype, kHeadDim, a.seq_q, static_cast<long long>(a.batch) * a.heads_q,
                             kWgmmaM);
  int device = 0, num_sms = 0;
  if (status.ok()) status = flash::cuda_status(cudaGetDevice(&device));
  if (status.ok()) status = flash::cuda_status(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  if (!status.ok()) return status;
  const int num_q_tiles = (a.seq_q + Shape::kBlockRows - 1) / Shape::kBlockRows;
  const ScheduledGrid grid = persistent_schedule(a.batch * a.heads_q, num_q_tiles, kCausal, num_sms);
  kernel<<<static_cast<unsigned>(grid.blocks), kPingPongThreads, kSharedBytes, a.stream>>>(
      q_map, k_map, v_map, o_map, static_cast<Element*>(a.o), a.lse, problem_shape(a), grid.schedule);
  return flash::last_launch_status();
}

// At head_dim 64 a 64 x 128 tile's softmax costs as much as at 128 while its products halve; a wider
// tile spreads each K/V tile's fixed costs (the waits, the turns, the row maxima across lanes, the
// rescale) over more keys. 160 is the widest that fits: with two P buffers of 160 keys, the scores
// and the output, ptxas reports no spill, where 192 keys spill and serialize the wgmma (its message
// C7512); so do 160 keys at head_dim 128, whose output takes 32 registers more: it keeps 128. The
// wide tile costs where a sequence is short: causal rows meet the diagonal in one or two masked tiles
// of the few they see. The threshold is not derived: it separates the cells where 160 keys were
// measured to gain from those where they lost (see docs/experiments/stage12.md). It applies to causal
// shapes only: head_dim 64 without the mask runs the in-order kernel.
constexpr int kWideTileMinKeys = 4096;

// The choice between the two kernels. At head_dim 64 without the mask, the in-order kernel: measured
// faster there at every sequence length, and far behind the ping-pong kernel with the mask or at
// head_dim 128 (in_order_kernel.cuh says why, likely). Everywhere else the ping-pong kernel, with
// 160-key K/V tiles at head_dim 64 on long sequences.
template <typename Element>
flash::Status launch(const Launch& a) {
  if (a.head_dim == 64) {
    if (!a.causal) return launch_in_order<Element>(a);
    if (a.seq_kv >= kWideTileMinKeys) return launch_pingpong<Element, 64, true, 160>(a);
    return launch_pingpong<Element, 64, true, 128>(a);
  }
  if (a.causal) return launch_pingpong<Element, 128, true, 128>(a);
  return launch_pingpong<Element, 128, false, 128>(a);
}

#endif  // FLASH_STAGE12_SM90A

}  // namespace

size_t forward_workspace_size(int, int, int, int, int, int) { return 0; }

flash::Status check_gpu() {
  int cc = 0;
  const flash::Status s = flash::compute_capability(&cc);
  if (!s.ok()) return s;
#if defined(FLASH_STAGE12_SM90A)
  if (cc != kHopper)
    return flash::with_detail(flash::make_status(flash::StatusCode::kArchNotSupported, "device", cc, kHopper),
                              "stage 12 needs compute capability 9.0 (its sm_90a code, wgmma and setmaxnreg, runs "
                              "on Hopper GPUs only)");
  return flash::Status{};
#else
  return flash::with_detail(flash::make_status(flash::StatusCode::kArchNotSupported, "device", cc, kHopper),
                            "this build of stage 12 has no sm_90a code (configure with 90 in "
                            "CMAKE_CUDA_ARCHITECTURES to build it)");
#endif
}

flash::Status forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, flash::DType dtype,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const flash::Status status = check_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                          dtype, workspace, workspace_bytes);
  if (!status.ok()) return status;
#if defined(FLASH_STAGE12_SM90A)
  const Launch a{q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, dtype, stream};
  return dtype == flash::DType::kFp16 ? launch<__half>(a) : launch<__nv_bfloat16>(a);
#else
  (void)causal;
  (void)stream;
  return flash::make_status(flash::StatusCode::kArchNotSupported, "device", 0, kHopper);  // check_gpu refused first
#endif
}

}  // namespace stage12

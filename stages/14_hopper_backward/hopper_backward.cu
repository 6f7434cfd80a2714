// Stage 14: the backward on Hopper. This file checks the arguments and the GPU, lays out the
// workspace, makes the TMA tensor maps and launches the three steps in order:
//   1. prepare_kernel (steps.cuh): D and the base-2 lse per query row, the dQ accumulator zeroed;
//   2. backward_kernel (backward_kernel.cuh, from the pieces of mainloop.cuh): one block per K/V tile,
//      dK and dV in registers, dQ's shares added into the accumulator by the copy engine;
//   3. convert_dq_kernel (steps.cuh): dQ from the accumulator.
// Read them in that order, mainloop.cuh before backward_kernel.cuh.
//
// Built two ways (CMakeLists.txt), as stage 12: for sm_90a, with FLASH_STAGE14_SM90A defined, when the
// configured CUDA architectures include Hopper; otherwise as a stub that refuses every call with
// kArchNotSupported.
#include "hopper_backward.h"

#if defined(FLASH_STAGE14_SM90A)
#include "backward_kernel.cuh"
#include "steps.cuh"
#include "tensor_map.h"
#endif

namespace stage14 {
namespace {

// The one compute capability whose code this stage carries (sm_90a: wgmma, setmaxnreg).
constexpr int kHopper = 90;
// Every per-row array of the workspace holds seq_q rounded up to this many rows per head: whole query
// tiles of either head_dim's Br (64 or 128).
constexpr int kRowPadding = 128;
// The deterministic mode's counters: one per query tile of the smaller Br.
constexpr int kCounterRows = 64;

// The dQ accumulator's floats per row: the tiles' head_dim (BackwardTiles: 64 at head_dim 32).
long long accum_columns(int head_dim) { return head_dim < 64 ? 64 : head_dim; }

long long padded_rows_per_head(int seq_q) {
  return (static_cast<long long>(seq_q) + kRowPadding - 1) / kRowPadding * kRowPadding;
}

flash::Status check_args(const void* q, const void* k, const void* v, const void* o, const float* lse,
                         const void* d_o, void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv,
                         int seq_q, int seq_kv, int head_dim, float scale, flash::DType dtype, const void* workspace,
                         size_t workspace_bytes) {
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
  if (status.ok()) status = check_gpu();
  if (status.ok()) status = flash::check_shared_memory(backward_shared_bytes(head_dim));
  return status;
}

#if defined(FLASH_STAGE14_SM90A)

constexpr int kStepThreads = 256;  // prepare_kernel and convert_dq_kernel

// The workspace, in order: lse2 and D (padded rows each), the dQ accumulator (padded rows x
// accum_columns floats), the counters. Every part starts 16-byte aligned: padded rows are a multiple
// of 128.
struct Workspace {
  float* lse2;
  float* d;
  float* dq_accum;
  int* counters;
  long long padded_rows, num_counters;
};

Workspace carve(void* base, int batch, int heads_q, int seq_q, int head_dim) {
  Workspace w;
  w.padded_rows = static_cast<long long>(batch) * heads_q * padded_rows_per_head(seq_q);
  w.num_counters = w.padded_rows / kCounterRows;
  w.lse2 = static_cast<float*>(base);
  w.d = w.lse2 + w.padded_rows;
  w.dq_accum = w.d + w.padded_rows;
  w.counters = reinterpret_cast<int*>(w.dq_accum + w.padded_rows * accum_columns(head_dim));
  return w;
}

// One call's arguments, as backward() took them (checked).
struct Launch {
  const void *q, *k, *v, *o;
  const float* lse;
  const void* d_o;
  void *dq, *dk, *dv;
  int batch, heads_q, heads_kv, seq_q, seq_kv;
  float scale;
  bool causal, deterministic;
  flash::DType dtype;
  void* workspace;
  cudaStream_t stream;
};

template <typename Element, int kHeadDim, bool kCausal, bool kDeterministic>
flash::Status launch_main(const Launch& a, const Workspace& ws) {
  using Tiles = BackwardTiles<kHeadDim>;
  const auto kernel = backward_kernel<Element, kHeadDim, kCausal, kDeterministic>;
  constexpr size_t kSharedBytes = SharedLayout<Tiles>::kDynamicBytes;
  flash::Status status = flash::allow_shared_memory(kernel, kSharedBytes);
  // Q and dO in boxes of one query tile, K and V of one K/V tile (the batch and head dimensions
  // flattened: tensor_map::make_3d).
  const long long heads_total_q = static_cast<long long>(a.batch) * a.heads_q;
  const long long heads_total_kv = static_cast<long long>(a.batch) * a.heads_kv;
  CUtensorMap q_map, k_map, v_map, do_map;
  if (status.ok())
    status = tensor_map::make_3d(&q_map, a.q, a.dtype, kHeadDim, a.seq_q, heads_total_q, kPanelCols, Tiles::kBlockRows);
  if (status.ok())
    status = tensor_map::make_3d(&do_map, a.d_o, a.dtype, kHeadDim, a.seq_q, heads_total_q, kPanelCols,
                                 Tiles::kBlockRows);
  if (status.ok())
    status = tensor_map::make_3d(&k_map, a.k, a.dtype, kHeadDim, a.seq_kv, heads_total_kv, kPanelCols, kBlockCols);
  if (status.ok())
    status = tensor_map::make_3d(&v_map, a.v, a.dtype, kHeadDim, a.seq_kv, heads_total_kv, kPanelCols, kBlockCols);
  if (!status.ok()) return status;
  // A wave of K/V heads (block_work): as many heads' blocks as fit one per SM, at least one head.
  const int num_key_tiles = (a.seq_kv + kBlockCols - 1) / kBlockCols;
  int device = 0, num_sms = 0;
  status = flash::cuda_status(cudaGetDevice(&device));
  if (status.ok())
    status = flash::cuda_status(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  if (!status.ok()) return status;
  const ProblemShape problem{a.batch,
                             a.heads_q,
                             a.heads_kv,
                             a.seq_q,
                             a.seq_kv,
                             static_cast<int>(padded_rows_per_head(a.seq_q)),
                             a.scale * kLog2e,
                             a.scale,
                             std::max(1, num_sms / num_key_tiles)};
  const long long blocks = heads_total_kv * num_key_tiles;
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSharedBytes, a.stream>>>(
      q_map, k_map, v_map, do_map, ws.lse2, ws.d, ws.dq_accum, ws.counters, static_cast<Element*>(a.dk),
      static_cast<Element*>(a.dv), problem);
  return flash::last_launch_status();
}

template <typename Element, int kHeadDim>
flash::Status launch(const Launch& a) {
  const Workspace ws = carve(a.workspace, a.batch, a.heads_q, a.seq_q, kHeadDim);
  const int padded_seq_q = static_cast<int>(padded_rows_per_head(a.seq_q));
  // 1. D, lse2, the accumulator and the counters.
  constexpr int kLanesPerRow = kHeadDim / kVecElems;
  const long long prepare_threads = ws.padded_rows * kLanesPerRow;
  prepare_kernel<Element, kHeadDim>
      <<<static_cast<unsigned>((prepare_threads + kStepThreads - 1) / kStepThreads), kStepThreads, 0, a.stream>>>(
          static_cast<const Element*>(a.d_o), static_cast<const Element*>(a.o), a.lse, ws.lse2, ws.d, ws.dq_accum,
          ws.counters, ws.num_counters, a.seq_q, padded_seq_q, ws.padded_rows);
  flash::Status status = flash::last_launch_status();
  if (!status.ok()) return status;
  // 2. dK, dV and dQ's shares.
  if (a.causal)
    status = a.deterministic ? launch_main<Element, kHeadDim, true, true>(a, ws)
                             : launch_main<Element, kHeadDim, true, false>(a, ws);
  else
    status = a.deterministic ? launch_main<Element, kHeadDim, false, true>(a, ws)
                             : launch_main<Element, kHeadDim, false, false>(a, ws);
  if (!status.ok()) return status;
  // 3. dQ.
  const long long float4s = ws.padded_rows * BackwardTiles<kHeadDim>::kHeadDim / 4;
  convert_dq_kernel<Element, kHeadDim>
      <<<static_cast<unsigned>((float4s + kStepThreads - 1) / kStepThreads), kStepThreads, 0, a.stream>>>(
          ws.dq_accum, static_cast<Element*>(a.dq), float4s, a.seq_q, padded_seq_q, a.scale);
  return flash::last_launch_status();
}

#endif  // FLASH_STAGE14_SM90A

}  // namespace

size_t backward_workspace_size(int batch, int heads_q, int /*heads_kv*/, int seq_q, int /*seq_kv*/, int head_dim) {
  if (batch < 1 || heads_q < 1 || seq_q < 1 || head_dim < 1) return 0;
  const long long rows = static_cast<long long>(batch) * heads_q * padded_rows_per_head(seq_q);
  return static_cast<size_t>(rows) * (2 + accum_columns(head_dim)) * sizeof(float) +
         static_cast<size_t>(rows / kCounterRows) * sizeof(int);
}

size_t backward_shared_bytes(int head_dim) {
#if defined(FLASH_STAGE14_SM90A)
  if (head_dim == 32) return SharedLayout<BackwardTiles<32>>::kDynamicBytes;
  if (head_dim == 64) return SharedLayout<BackwardTiles<64>>::kDynamicBytes;
  if (head_dim == 128) return SharedLayout<BackwardTiles<128>>::kDynamicBytes;
#else
  (void)head_dim;
#endif
  return 0;
}

flash::Status check_gpu() {
  int cc = 0;
  const flash::Status s = flash::compute_capability(&cc);
  if (!s.ok()) return s;
#if defined(FLASH_STAGE14_SM90A)
  if (cc != kHopper)
    return flash::with_detail(flash::make_status(flash::StatusCode::kArchNotSupported, "device", cc, kHopper),
                              "stage 14 needs compute capability 9.0 (its sm_90a code, wgmma and setmaxnreg, runs "
                              "on Hopper GPUs only)");
  return flash::Status{};
#else
  return flash::with_detail(flash::make_status(flash::StatusCode::kArchNotSupported, "device", cc, kHopper),
                            "this build of stage 14 has no sm_90a code (configure with 90 in "
                            "CMAKE_CUDA_ARCHITECTURES to build it)");
#endif
}

flash::Status backward(const void* q, const void* k, const void* v, const void* o, const float* lse, const void* d_o,
                       void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv,
                       int head_dim, float scale, bool causal, flash::DType dtype, bool deterministic,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const flash::Status status = check_args(q, k, v, o, lse, d_o, dq, dk, dv, batch, heads_q, heads_kv, seq_q, seq_kv,
                                          head_dim, scale, dtype, workspace, workspace_bytes);
  if (!status.ok()) return status;
#if defined(FLASH_STAGE14_SM90A)
  const Launch a{q,       k,        v,     o,      lse,   d_o,    dq,            dk,    dv,        batch,
                 heads_q, heads_kv, seq_q, seq_kv, scale, causal, deterministic, dtype, workspace, stream};
  if (dtype == flash::DType::kFp16) {
    if (head_dim == 32) return launch<__half, 32>(a);
    return head_dim == 64 ? launch<__half, 64>(a) : launch<__half, 128>(a);
  }
  if (head_dim == 32) return launch<__nv_bfloat16, 32>(a);
  return head_dim == 64 ? launch<__nv_bfloat16, 64>(a) : launch<__nv_bfloat16, 128>(a);
#else
  (void)causal, (void)deterministic, (void)stream;
  return flash::make_status(flash::StatusCode::kArchNotSupported, "device", 0, kHopper);  // check_gpu refused first
#endif
}

}  // namespace stage14

// Stage 12's ladder (ladder.h): the arguments and the GPU checked as stage12::forward checks them, the
// TMA tensor maps, and one configuration of ladder_kernel.cuh launched per rung. The tensor maps are
// made as stages/12_hopper/hopper.cu makes them.
//
// Built two ways (bench/CMakeLists.txt): for sm_90a, with FLASH_STAGE12_SM90A defined, when the
// configured CUDA architectures include Hopper; otherwise as a stub that refuses every call.
#include "ladder.h"

#include "12_hopper/hopper.h"

#if defined(FLASH_STAGE12_SM90A)
#include <algorithm>

#include "ladder_kernel.cuh"
#include "tensor_map.h"
#endif

namespace stage12_ladder {
namespace {

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
  if (status.ok()) status = stage12::check_gpu();
  return status;
}

#if defined(FLASH_STAGE12_SM90A)

// ---------------------------------------------------------------------------------------------
// TMA tensor maps
// ---------------------------------------------------------------------------------------------

// A 3-D TMA map in boxes of one 64-column panel by box_rows rows: the stage's (tensor_map.h).
flash::Status make_tensor_map(CUtensorMap* map, const void* base, flash::DType dtype, int head_dim, int seq,
                              long long heads_total, int box_rows) {
  return tensor_map::make_3d(map, base, dtype, head_dim, seq, heads_total, kernel_detail::kPanelCols, box_rows);
}

// ---------------------------------------------------------------------------------------------
// Launch
// ---------------------------------------------------------------------------------------------

// How a grid's work tiles reach its blocks: a block per work tile; one block per SM, each taking work
// tiles in turn; or, persistent and causal, in pairs of query tiles, head by head, where the heads are
// more than half the SMs (below); the same with the last heads' tiles one at a time after the pairs
// (kPairsThenSingles); and that at any head count (kPairsAlways).
enum class Schedule { kBlockPerTile, kPersistent, kPersistentPairs, kPairsThenSingles, kPairsAlways };

template <typename Element, int kHeadDim, class Config>
flash::Status launch_ladder(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                            int heads_kv, int seq_q, int seq_kv, float scale, bool causal, flash::DType dtype,
                            Schedule schedule, cudaStream_t stream) {
  const bool persistent = schedule != Schedule::kBlockPerTile;
  const auto kernel = causal ? ladder_kernel<Element, kHeadDim, true, Config>
                             : ladder_kernel<Element, kHeadDim, false, Config>;
  constexpr size_t kSharedBytes = kernel_detail::SharedLayout<kHeadDim, Config>::kDynamicBytes;
  flash::Status status = flash::check_shared_memory(kSharedBytes);
  if (status.ok())
    status = flash::allow_shared_memory(kernel, kSharedBytes);
  CUtensorMap q_map, k_map, v_map, o_map;
  const long long heads_total_q = static_cast<long long>(batch) * heads_q;
  const long long heads_total_kv = static_cast<long long>(batch) * heads_kv;
  if (status.ok())
    status = make_tensor_map(&q_map, q, dtype, kHeadDim, seq_q, heads_total_q, kernel_detail::kWgmmaM);
  if (status.ok())
    status = make_tensor_map(&k_map, k, dtype, kHeadDim, seq_kv, heads_total_kv, Config::kBlockCols);
  if (status.ok())
    status = make_tensor_map(&v_map, v, dtype, kHeadDim, seq_kv, heads_total_kv, Config::kBlockCols);
  // O has Q's shape; each consumer warpgroup stores its 64 rows (kTmaStore; unused otherwise).
  if (status.ok())
    status = make_tensor_map(&o_map, o, dtype, kHeadDim, seq_q, heads_total_q, kernel_detail::kWgmmaM);
  if (!status.ok()) return status;
  const int num_q_tiles = (seq_q + Config::kBlockRows - 1) / Config::kBlockRows;
  const int num_heads_total = batch * heads_q;
  int num_sms = 0;
  if (persistent) {
    int device = 0;
    status = flash::cuda_status(cudaGetDevice(&device));
    if (status.ok()) status = flash::cuda_status(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
    if (!status.ok()) return status;
  }
  // Causal work tiles one at a time, longest first, spread each pass of a persistent grid over
  // min(heads, SMs) heads. With more heads than half the SMs, most heads have one block in a pass and
  // their next query tile comes passes later, after their K and V have left the L2. Pairs of query
  // tiles (kPersistentPairs) keep a head's tiles together; a pair is twice the work of a tile, though, so
  // the last pass leaves more SMs idle, which costs where the heads are few and the sequences long.
  // "Half the SMs" is not derived: it separates the cells where pairs were measured to gain from
  // those where they lost (docs/experiments/stage12.md). kPairsAlways drops it:
  // with single tiles after the pairs, the last pass no longer waits for whole pairs.
  const bool pairs = schedule == Schedule::kPersistentPairs || schedule == Schedule::kPairsThenSingles ||
                     schedule == Schedule::kPairsAlways;
  const bool many_heads = 2 * num_heads_total > num_sms;
  const int tiles_per_unit = pairs && causal && (many_heads || schedule == Schedule::kPairsAlways) ? 2 : 1;
  // The tail: about one pass of pairs (num_sms of them), in whole heads, one query tile a unit. The
  // pairs that do not fill the last pass are what leaves SMs idle; single tiles of every length,
  // longest first, give the serpentine order short tiles to even the last pass out with. Whole heads,
  // so that a tail unit's head and query tile come from one division (the kernel's tail_divisor).
  // "One pass" is not derived either: it is the size measured to gain on every cell that takes pairs
  // (docs/experiments/stage12.md, "Single tiles after the pairs").
  int tail_heads = 0;
  if (tiles_per_unit == 2 && schedule != Schedule::kPersistentPairs) {
    const int pairs_per_head = kernel_detail::units_per_head(num_q_tiles, tiles_per_unit);
    tail_heads = std::min(num_heads_total, (num_sms + pairs_per_head - 1) / pairs_per_head);
  }
  int blocks = kernel_detail::num_work_units(num_heads_total, num_q_tiles, tiles_per_unit, tail_heads);
  // One block per SM is all that fits: the registers of 384 threads at 168 each (setmaxnreg).
  if (persistent) blocks = std::min(blocks, num_sms);
  // The kernel's divisions of a work unit's index (ladder_kernel's work_tile_of_step): by the units
  // of a head, or, causal one tile at a time, by the heads; then by heads_q, and by the query heads
  // that share a K/V head; in the tail, by its heads.
  const int unit_divisor = tiles_per_unit == 1 && causal ? num_heads_total
                                                         : kernel_detail::units_per_head(num_q_tiles, tiles_per_unit);
  kernel<<<static_cast<unsigned>(blocks), Config::kThreads, kSharedBytes, stream>>>(
      q_map, k_map, v_map, o_map, static_cast<Element*>(o), lse, heads_q, heads_kv, seq_q, seq_kv,
      scale * kernel_detail::kLog2e, num_q_tiles, num_heads_total, tiles_per_unit, tail_heads,
      kernel_detail::make_grid_divisor(unit_divisor), kernel_detail::make_grid_divisor(heads_q),
      kernel_detail::make_grid_divisor(heads_q / heads_kv), kernel_detail::make_grid_divisor(std::max(1, tail_heads)));
  return flash::last_launch_status();
}

// The rungs' configurations, each adding one piece to the one before
// (HopperConfig<consumers, keys per tile, stages, register split, ping-pong, intra overlap, TMA store,
// Q buffers, back to back, store behind the next scores, odd last tile unmasked>); the persistent ones
// also differ in their Schedule (forward_variant).
using VariantA = HopperConfig<1, 128, 2>;
using VariantTwoConsumers = HopperConfig<2, 128, 2>;
using VariantRegisterSplit = HopperConfig<2, 128, 2, true>;
using VariantPingPong = HopperConfig<2, 128, 2, true, true>;
using VariantIntraOverlap = HopperConfig<2, 128, 2, true, true, true>;
using VariantTmaStore = HopperConfig<2, 128, 2, true, true, true, true>;
using VariantPersistent = HopperConfig<2, 128, 2, true, true, true, true, 2>;  // and query tiles in pairs
using VariantBackToBack = HopperConfig<2, 128, 2, true, true, true, true, 2, true>;
using VariantStoreBehindScores = HopperConfig<2, 128, 2, true, true, true, true, 2, true, true>;
using VariantLeftoverUnmasked = HopperConfig<2, 128, 2, true, true, true, true, 2, true, true, true>;
// kWideKeyTiles: at head_dim 64, 160 keys per K/V tile on long sequences (wide_key_tiles).
using VariantWideKeyTiles = HopperConfig<2, 160, 2, true, true, true, true, 2, true, true, true>;

// At head_dim 64 a 64 x 128 tile's softmax costs as much as at 128 while its products halve; a wider
// tile spreads each K/V tile's fixed costs (the waits, the turns, the row maxima across lanes, the
// rescale) over more keys. 160 is the widest that fits: with two P buffers of 160 keys, the scores
// and the output, ptxas reports no spill, where 192 keys spill and serialize the wgmma (its message
// C7512); so do 160 keys at head_dim 128, whose output takes 32 registers more: it keeps 128. The
// wide tile costs where a sequence is short: seq_kv = 1024 is 6.4 tiles of 160 keys, the last one
// masked, and causal rows meet the diagonal in one or two masked tiles of the few they see. The
// thresholds are not derived: they separate the cells where 160 keys were measured to gain from
// those where they lost (docs/experiments/stage12.md).
constexpr int kWideTileMinKeys = 2048;
constexpr int kWideTileMinKeysCausal = 4096;
bool wide_key_tiles(int seq_kv, bool causal) {
  return seq_kv >= (causal ? kWideTileMinKeysCausal : kWideTileMinKeys);
}

// Config at head_dim 128, ConfigHeadDim64 at 64.
template <class Config, class ConfigHeadDim64 = Config>
flash::Status launch_config(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                            int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal,
                            flash::DType dtype, cudaStream_t stream, Schedule schedule = Schedule::kBlockPerTile) {
  if (dtype == flash::DType::kFp16) {
    if (head_dim == 64)
      return launch_ladder<__half, 64, ConfigHeadDim64>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv,
                                                        scale, causal, dtype, schedule, stream);
    return launch_ladder<__half, 128, Config>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal,
                                              dtype, schedule, stream);
  }
  if (head_dim == 64)
    return launch_ladder<__nv_bfloat16, 64, ConfigHeadDim64>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q,
                                                              seq_kv, scale, causal, dtype, schedule, stream);
  return launch_ladder<__nv_bfloat16, 128, Config>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale,
                                                   causal, dtype, schedule, stream);
}

// The kernels of kWideKeyTiles (160 keys a K/V tile at head_dim 64 on long sequences, 128 elsewhere)
// under one of the persistent schedules with pairs.
flash::Status launch_key_tiles(const void* q, const void* k, const void* v, void* o, float* lse, int batch,
                               int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal,
                               flash::DType dtype, cudaStream_t stream, Schedule schedule) {
  if (wide_key_tiles(seq_kv, causal))
    return launch_config<VariantLeftoverUnmasked, VariantWideKeyTiles>(
        q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, dtype, stream, schedule);
  return launch_config<VariantLeftoverUnmasked>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                                                scale, causal, dtype, stream, schedule);
}

#endif  // FLASH_STAGE12_SM90A

}  // namespace

const char* variant_name(Variant variant) {
  switch (variant) {
    case Variant::kRegistered: return "stage 12 as built";
    case Variant::kOneConsumer: return "1 consumer warpgroup, in order";
    case Variant::kTwoConsumers: return "+ 2 consumer warpgroups";
    case Variant::kRegisterSplit: return "+ setmaxnreg (producer warpgroup)";
    case Variant::kPingPong: return "+ ping-pong";
    case Variant::kIntraOverlap: return "+ intra-warpgroup overlap";
    case Variant::kTmaStore: return "+ TMA store of O";
    case Variant::kPersistent: return "+ persistent blocks";
    case Variant::kTilePairs: return "+ query tiles in pairs, head by head";
    case Variant::kBackToBack: return "+ work tiles back to back";
    case Variant::kStoreBehindScores: return "+ O stored behind the next scores";
    case Variant::kLeftoverUnmasked: return "+ odd last tile unmasked";
    case Variant::kWideKeyTiles: return "+ 160-key tiles (d64, long seq_kv)";
    case Variant::kSinglesAfterPairs: return "+ single tiles after the pairs";
    case Variant::kPairsAtAnyHeadCount: return "+ pairs at any head count";
    case Variant::kInOrderAtHeadDim64: return "+ in-order kernel at head_dim 64, not causal";
  }
  return "unknown variant";
}

flash::Status forward_variant(Variant variant, const void* q, const void* k, const void* v, void* o, float* lse,
                              int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                              bool causal, flash::DType dtype, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  const flash::Status status = check_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                          dtype, workspace, workspace_bytes);
  if (!status.ok()) return status;
  if (static_cast<int>(variant) < 0 || static_cast<int>(variant) >= kVariantCount)
    return flash::make_status(flash::StatusCode::kInvalidArgument, "variant", static_cast<int>(variant));
  if (variant == Variant::kRegistered)
    return stage12::forward(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, dtype,
                            workspace, workspace_bytes, stream);
#if defined(FLASH_STAGE12_SM90A)
  switch (variant) {
    case Variant::kOneConsumer:
      return launch_config<VariantA>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                     causal, dtype, stream);
    case Variant::kTwoConsumers:
      return launch_config<VariantTwoConsumers>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                                                scale, causal, dtype, stream);
    case Variant::kRegisterSplit:
      return launch_config<VariantRegisterSplit>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                                                 scale, causal, dtype, stream);
    case Variant::kPingPong:
      return launch_config<VariantPingPong>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                            causal, dtype, stream);
    case Variant::kIntraOverlap:
      return launch_config<VariantIntraOverlap>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                                                scale, causal, dtype, stream);
    case Variant::kPersistent:
      return launch_config<VariantPersistent>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                                              scale, causal, dtype, stream, Schedule::kPersistent);
    case Variant::kTilePairs:
      return launch_config<VariantPersistent>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                                              scale, causal, dtype, stream, Schedule::kPersistentPairs);
    case Variant::kBackToBack:
      return launch_config<VariantBackToBack>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                                              scale, causal, dtype, stream, Schedule::kPersistentPairs);
    case Variant::kStoreBehindScores:
      return launch_config<VariantStoreBehindScores>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv,
                                                     head_dim, scale, causal, dtype, stream,
                                                     Schedule::kPersistentPairs);
    case Variant::kWideKeyTiles:
      return launch_key_tiles(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, dtype,
                              stream, Schedule::kPersistentPairs);
    case Variant::kSinglesAfterPairs:
      return launch_key_tiles(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, dtype,
                              stream, Schedule::kPairsThenSingles);
    case Variant::kPairsAtAnyHeadCount:
      return launch_key_tiles(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, dtype,
                              stream, Schedule::kPairsAlways);
    case Variant::kInOrderAtHeadDim64:
      // At head_dim 64 without the mask, the in-order kernel of kOneConsumer: measured faster than the
      // pieces after it at every N there once the K/V loops stayed on the uniform datapath, and far
      // behind with the mask or at head_dim 128 (docs/experiments/stage12.md). The likely reason, not
      // profiled: up to three of its blocks share an SM, and their softmaxes and boundaries fall at
      // different times, where the persistent kernel's two consumers meet every boundary together.
      if (head_dim == 64 && !causal)
        return launch_config<VariantA>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                       causal, dtype, stream);
      return launch_key_tiles(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, dtype,
                              stream, Schedule::kPairsAlways);
    case Variant::kLeftoverUnmasked:
      return launch_config<VariantLeftoverUnmasked>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv,
                                                    head_dim, scale, causal, dtype, stream,
                                                    Schedule::kPersistentPairs);
    case Variant::kTmaStore:
    default:  // every other value is named above; kRegistered returned before the switch
      return launch_config<VariantTmaStore>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                            causal, dtype, stream);
  }
#else
  (void)causal;
  (void)stream;
  return flash::make_status(flash::StatusCode::kArchNotSupported, "device", 0, 90);  // check_gpu refused first
#endif
}

}  // namespace stage12_ladder

// Stage 12's kernel as a ladder of configurations (HopperConfig), each switching on one more piece,
// for bench/stage12_variants.cu to measure each piece switched on and off. stages/12_hopper/ holds the
// path the registered stage runs, written with these choices resolved; this copy keeps every switch
// so that each rung measures what it measured (docs/experiments/stage12.md, "The ladder from one
// consumer warpgroup to the registered kernel").
//
// What the rungs change from stage 10, one at a time:
// - The matrix products are wgmma.mma_async: one instruction per 64 x N x 16 product for a whole
//   warpgroup (4 warps, 128 threads), its operands read by the tensor cores straight from shared
//   memory through matrix descriptors (no ldmatrix), asynchronous: issued, committed, waited for.
//   S = Q K^T takes both operands from shared memory; O += P V takes P from registers (the same
//   accumulator-to-operand conversion as stages 08-10) and V from shared memory, "transposed"
//   (MN-major: V's rows are keys, its contiguous dimension is N = head_dim).
// - Q, K and V reach shared memory through the tensor memory accelerator (cp.async.bulk.tensor):
//   one thread issues a copy of a whole tile, described by a tensor map made on the host, and the
//   copy engine writes it already swizzled (128-byte swizzle, the layout wgmma reads) and reports
//   the bytes to an mbarrier. Rows past the end of the sequence are filled with zeros by the engine.
// - Warp specialization: a producer (one warp, or a whole warpgroup when registers are
//   reallocated) issues every copy; one or two consumer warpgroups compute. They talk only through
//   mbarriers: for each of the kStages K and V buffers a "full" barrier (the producer's expected
//   bytes, completed by the copy engine) and an "empty" barrier (one arrival per consumer warp when
//   its wgmma have finished reading the buffer).
// - Register reallocation (kRegisterSplit): the producer warpgroup gives registers back
//   (setmaxnreg.dec), the consumers take them (setmaxnreg.inc).
// - Two consumer warpgroups take turns on the tensor cores (kPingPong): while one runs its softmax
//   the other's matrix products run. Two named barriers pass the turn.
// - Inside a warpgroup (kIntraOverlap), the softmax of tile j runs while the product P_{j-1} V_{j-1}
//   of the tile before is still on the tensor cores.
// - The output through shared memory (kTmaStore): each consumer warpgroup writes its O tile into
//   its Q buffer, which no product reads any more, and one thread hands the tile to the copy engine
//   (a TMA store), instead of every thread storing its fragments to global memory.
// - Persistent blocks (a launch choice, with two Q buffers, kQStages): one block per SM takes a work
//   tile in each pass over the grid, in serpentine order. The K/V ring carries on from one work tile
//   to the next and Q alternates between its buffers, so the producer loads the next tile's Q and
//   first K/V tiles while the consumers still work on this one; each buffer's "Q empty" barrier
//   tells it when the buffer may be overwritten.
// - Query tiles in pairs, head by head (a launch choice, tiles_per_unit): a persistent causal block
//   takes query tiles i and num_q_tiles - 1 - i of one head in turn, so blocks get equal work without
//   taking the longest tile of every head first, and the blocks in flight share the K and V of a few
//   heads in L2.
// - Single tiles after the pairs (a launch choice, tail_heads): the last heads' query tiles come
//   one at a time, longest first, after the pairs of the others, so that the blocks of the last pass
//   end together instead of some of them taking one more pair while the others wait.
// - Work tiles back to back (kBackToBack): a persistent block's two consumers go on to their next
//   work tile without meeting in between. The ping-pong turns carry over from one work tile to the
//   next, and the thread that stored O waits for the copy engine to read it during the next work tile,
//   not before it.
// - Each work tile's search (which head, which query tile) divides by numbers fixed for the grid with
//   a multiply-high and a shift (GridDivisor) instead of the division sequence, whose latency the
//   consumers wait for between work tiles.
// - The warpgroup index comes from lane 0 of the warp (a shuffle), so that ptxas knows it is the same
//   in all 32 lanes: the K/V loops' counters, barrier addresses and wgmma descriptors, which depend on
//   it through a consumer's rows, stay on the uniform datapath.
// - O stored behind the next scores (kStoreBehindScores): a work tile's output is rounded when its
//   last product is done, but written to shared memory and handed to the copy engine only once the
//   next work tile's first S = Q K^T is on the tensor cores, so the store no longer delays it.
// - The odd last tile unmasked (kLeftoverUnmasked): the consumer loop runs its tiles in pairs, and a
//   tile left over used to run masked; where no tile needs the mask it now runs unmasked.
// - The softmax itself is stage 10's: base 2, the scale inside the exp2's FFMA, a negative scale
//   folded into Q in shared memory (which, between two async-proxy accesses, needs a proxy fence).
//   It reads the scores and writes the probabilities straight into P's registers. Whether a tile is
//   masked is a template parameter of the softmax, not a flag: each consumer loop runs the tiles
//   that need no mask, then the rest.
#pragma once

#include <type_traits>

#include "flash_stage.cuh"
#include "hopper.cuh"
#include "tensor_core.cuh"

namespace stage12_ladder {

// One kernel instance.
//   kConsumers: consumer warpgroups, 64 query rows each (Br = 64 * kConsumers).
//   kBlockCols: keys per K/V tile (Bc), the N of S = Q K^T: 64, 128 or 160.
//   kStages: K/V buffers in the ring between producer and consumers.
//   kRegisterSplit: the producer is a whole warpgroup that gives its registers to the consumers
//     (setmaxnreg); otherwise it is one warp and every thread keeps the registers the launch gave it.
//   kPingPong: two consumer warpgroups take turns issuing their matrix products (needs 2 consumers).
//   kIntraOverlap: a warpgroup's softmax of tile j overlaps its product P_{j-1} V_{j-1}.
//   kTmaStore: O leaves through shared memory and a TMA store (store_output_tma).
//   kQStages: Q buffers; two let a persistent block load the next work tile's Q while the consumers
//     still work on this one's.
//   kBackToBack: the consumers' turns and O's store carry over from one work tile to the next (a
//     persistent grid's; needs the ping-pong, the intra-warpgroup overlap, the TMA store and two Q
//     buffers).
//   kStoreBehindScores: a work tile's O is stored while the next work tile's first scores are on the
//     tensor cores, not before they are issued (needs kBackToBack).
//   kLeftoverUnmasked: where no K/V tile needs the mask, a tile left over after the consumer loop's
//     pairs runs unmasked (consume_overlapped).
template <int kConsumers_, int kBlockCols_, int kStages_, bool kRegisterSplit_ = false, bool kPingPong_ = false,
          bool kIntraOverlap_ = false, bool kTmaStore_ = false, int kQStages_ = 1, bool kBackToBack_ = false,
          bool kStoreBehindScores_ = false, bool kLeftoverUnmasked_ = false>
struct HopperConfig {
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBlockRows = 64 * kConsumers;
  static constexpr int kBlockCols = kBlockCols_;
  static constexpr int kStages = kStages_;
  static constexpr bool kRegisterSplit = kRegisterSplit_;
  static constexpr bool kPingPong = kPingPong_;
  static constexpr bool kIntraOverlap = kIntraOverlap_;
  static constexpr bool kTmaStore = kTmaStore_;
  static constexpr int kQStages = kQStages_;
  static constexpr bool kBackToBack = kBackToBack_;
  static constexpr bool kStoreBehindScores = kStoreBehindScores_;
  static constexpr bool kLeftoverUnmasked = kLeftoverUnmasked_;
  // The consumers come first (warpgroups 0 .. kConsumers - 1, each starting at a warp index
  // divisible by 4, as wgmma requires), the producer after them.
  static constexpr int kProducerThreads = kRegisterSplit ? 128 : 32;
  static constexpr int kThreads = 128 * kConsumers + kProducerThreads;
  static_assert(kConsumers == 1 || kConsumers == 2, "one or two consumer warpgroups");
  static_assert(kBlockCols == 64 || kBlockCols == 128 || kBlockCols == 160,
                "the wgmma wrappers have N = 64, 128 and 160");
  static_assert(kStages >= 1, "at least one K/V buffer");
  static_assert(kQStages == 1 || kQStages == 2, "one or two Q buffers");
  static_assert(!kPingPong || kConsumers == 2, "ping-pong needs two consumer warpgroups");
  static_assert(!kBackToBack || (kPingPong && kIntraOverlap && kTmaStore && kQStages == 2),
                "back to back carries over the ping-pong's turns and the TMA store, into the other Q buffer");
  static_assert(!kStoreBehindScores || kBackToBack, "the store moves into the next work tile: back to back");
};

namespace kernel_detail {

using hopper::fence_registers;
using hopper::matrix_descriptor;
using hopper::mbarrier_arrive;
using hopper::mbarrier_arrive_expect_tx;
using hopper::mbarrier_wait;
using hopper::tma_load_3d;
using hopper::wgmma_commit_group;
using hopper::wgmma_fence;
using hopper::wgmma_wait_group;
using tensor_core::exp2_approx;
using tensor_core::pack2;

constexpr int kWarpgroupThreads = 128;  // 4 warps: the unit that issues a wgmma
constexpr int kWgmmaM = 64;             // the M of wgmma.m64nNk16: one warpgroup's query rows
constexpr int kWgmmaK = 16;             // its K, for 16-bit inputs
constexpr int kElementBytes = 2;        // fp16, bf16
constexpr int kSwizzleBytes = 128;      // CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunks swizzled within 128 bytes
constexpr int kPanelCols = kSwizzleBytes / kElementBytes;  // 64 elements: the widest box row the swizzle allows
constexpr int kAtomBytes = 8 * kSwizzleBytes;  // 1024: 8 rows of 128 bytes, where the swizzle pattern repeats
constexpr int kKStepBytes = kWgmmaK * kElementBytes;  // 32: how far one k-step moves along a K-major row
constexpr float kLog2e = 1.4426950408889634f;  // log2(e): exp(x) = 2^(x log2 e)
constexpr float kLn2 = 0.6931471805599453f;    // ln(2): turns a base-2 lse back into base e
constexpr unsigned kFullWarp = 0xffffffffu;
// Named barriers 1 and 2: "consumer 0's turn", "consumer 1's turn" (kPingPong). Barrier 0 belongs
// to __syncthreads(); 16 exist per CTA (PTX ISA, bar/barrier).
constexpr int kTurnBarrier = 1;
constexpr int kTurnThreads = 2 * kWarpgroupThreads;  // one warpgroup syncs, the other arrives
// Named barriers 3 and 4: consumer 0's, consumer 1's own 128 threads, after a negative scale was
// folded into their Q tile and (kTmaStore) after they wrote their O tile.
constexpr int kWarpgroupBarrier = 3;

// Consumer c waits for its turn on barrier kTurnBarrier + c; it passes the turn by arriving on the
// other's. The ids are immediates (hopper.cuh says why), hence the branch on the consumer.
__device__ inline void wait_for_turn(int consumer) {
  if (consumer == 0)
    hopper::named_barrier_sync<kTurnBarrier + 0, kTurnThreads>();
  else
    hopper::named_barrier_sync<kTurnBarrier + 1, kTurnThreads>();
}

__device__ inline void pass_turn(int consumer) {
  if (consumer == 0)
    hopper::named_barrier_arrive<kTurnBarrier + 1, kTurnThreads>();
  else
    hopper::named_barrier_arrive<kTurnBarrier + 0, kTurnThreads>();
}

// The 128 threads of consumer warpgroup `consumer` wait for one another.
__device__ inline void warpgroup_sync(int consumer) {
  if (consumer == 0)
    hopper::named_barrier_sync<kWarpgroupBarrier + 0, kWarpgroupThreads>();
  else
    hopper::named_barrier_sync<kWarpgroupBarrier + 1, kWarpgroupThreads>();
}
// setmaxnreg counts (kRegisterSplit, 2 consumers + 1 producer warpgroup = 384 threads): the launch
// gives each thread 65536 / 384 = 170, rounded down to 168 (__launch_bounds__(384, 1)); the producer
// keeps 24, the least setmaxnreg allows, and the consumers take (168 - 24) * 128 / 256 = 72 more:
// 240 each. 128 * 24 + 256 * 240 = 64512 <= 65536 registers per SM.
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;

// Where everything lives in the block's dynamic shared memory. Each tile is stored as kPanels
// column panels of 64 elements (128 bytes a row): the 128-byte swizzle holds rows of at most 128
// bytes (cuTensorMapEncodeTiled: the box's inner dimension <= the swizzle size), so head_dim 128 is
// two panels, each its own TMA box. Every panel starts on a 1024-byte boundary, where the swizzle
// pattern starts, so the descriptors' base offset is 0.
template <int kHeadDim, class Config>
struct SharedLayout {
  static constexpr int kPanels = kHeadDim / kPanelCols;
  static constexpr int kQPanelBytes = kWgmmaM * kSwizzleBytes;                 // 8 KiB
  static constexpr int kQBytes = kPanels * kQPanelBytes;                       // one consumer's Q
  static constexpr int kKVPanelBytes = Config::kBlockCols * kSwizzleBytes;     // 8, 16 or 20 KiB
  static constexpr int kKVBytes = kPanels * kKVPanelBytes;                     // one K or V tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + Config::kQStages * Config::kConsumers * kQBytes;
  static constexpr int kV = kK + Config::kStages * kKVBytes;
  static constexpr int kBarriers = kV + Config::kStages * kKVBytes;
  // q_full and q_empty for each Q buffer, then k_full, v_full, k_empty, v_empty for each stage: 8
  // bytes each.
  static constexpr int kNumBarriers = 2 * Config::kQStages + 4 * Config::kStages;
  static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
  // Dynamic shared memory is only promised 16-byte alignment: ask for one atom more and round up.
  static constexpr size_t kDynamicBytes = static_cast<size_t>(kBytes) + kAtomBytes;
  static_assert(kQPanelBytes % kAtomBytes == 0 && kKVPanelBytes % kAtomBytes == 0, "panels start on atoms");
  static_assert(kHeadDim % kPanelCols == 0, "head_dim is whole panels");
};

// The block's shared memory, carved from the dynamic allocation.
template <typename Element, int kHeadDim, class Config>
struct Smem {
  using L = SharedLayout<kHeadDim, Config>;
  unsigned char* base;  // 1024-byte aligned
  __device__ explicit Smem(unsigned char* raw) {
    const uint32_t misalignment = hopper::shared_address(raw) % kAtomBytes;
    base = raw + (misalignment == 0 ? 0 : kAtomBytes - misalignment);
  }
  // The block's q_round-th Q tile goes to Q buffer q_round % kQStages; its barriers complete once
  // per pass over the buffers, so the phase of round r is (r / kQStages) % 2 (as ring_parity).
  // Panel p of consumer c's part of round r's Q tile; of stage s's K and V tiles.
  __device__ unsigned char* q(int r, int c, int p) const {
    return base + L::kQ + ((r % Config::kQStages) * Config::kConsumers + c) * L::kQBytes + p * L::kQPanelBytes;
  }
  __device__ unsigned char* k(int s, int p) const { return base + L::kK + s * L::kKVBytes + p * L::kKVPanelBytes; }
  __device__ unsigned char* v(int s, int p) const { return base + L::kV + s * L::kKVBytes + p * L::kKVPanelBytes; }
  __device__ uint64_t* barriers() const { return reinterpret_cast<uint64_t*>(base + L::kBarriers); }
  __device__ uint64_t* q_full(int r) const { return barriers() + r % Config::kQStages; }
  __device__ uint64_t* q_empty(int r) const { return barriers() + Config::kQStages + r % Config::kQStages; }
  __device__ static uint32_t q_parity(int r) { return (r / Config::kQStages) & 1; }
  static constexpr int kRing = 2 * Config::kQStages;  // the ring's barriers come after Q's
  __device__ uint64_t* k_full(int s) const { return barriers() + kRing + s; }
  __device__ uint64_t* v_full(int s) const { return barriers() + kRing + Config::kStages + s; }
  __device__ uint64_t* k_empty(int s) const { return barriers() + kRing + 2 * Config::kStages + s; }
  __device__ uint64_t* v_empty(int s) const { return barriers() + kRing + 3 * Config::kStages + s; }
};

// Descriptors (hopper.cuh explains the fields). Q and K are K-major (head_dim contiguous), so one
// k-step of 16 elements is 32 bytes along a 128-byte row; a k-step in the second panel starts in
// that panel. SBO = 1024: from one group of 8 rows to the next. LBO = 16 bytes, encoded 1: unused
// for a swizzled K-major operand, where the PTX ISA says it is "assumed to be 1".
constexpr uint32_t kKMajorLbo = 16;
constexpr uint32_t kSbo = kAtomBytes;

template <int kPanelBytes>
__device__ inline uint64_t k_major_descriptor(const unsigned char* panel0, int ks) {
  constexpr int kStepsPerPanel = kSwizzleBytes / kKStepBytes;  // 4
  return matrix_descriptor(panel0 + (ks / kStepsPerPanel) * kPanelBytes + (ks % kStepsPerPanel) * kKStepBytes,
                           kKMajorLbo, kSbo);
}

// V is MN-major as the B operand of O += P V (N = head_dim contiguous, K = keys along rows): one
// k-step is 16 key rows = 2048 bytes down the panel; LBO is the distance from one 64-column panel
// of N to the next (Bc rows of 128 bytes), SBO from one group of 8 key rows to the next (1024).
template <int kPanelBytes>
__device__ inline uint64_t mn_major_descriptor(const unsigned char* panel0, int ks) {
  return matrix_descriptor(panel0 + ks * kWgmmaK * kSwizzleBytes, kPanelBytes, kSbo);
}

__device__ inline float max_over_row_lanes(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullWarp, x, 2));
}

__device__ inline float sum_over_row_lanes(float x) {
  x += __shfl_xor_sync(kFullWarp, x, 1);
  return x + __shfl_xor_sync(kFullWarp, x, 2);
}

// The online softmax of one tile for this thread's two rows (row0 and row0 + 8), stage 10's, read
// from the scores s (Q was negated for a negative scale) without writing them: the
// probabilities 2^(s * scale_log2 - max2) go straight into p, wgmma's register A operand for
// O += P V, one fragment per 16 keys. row_max2 and row_sum move on; rescale[h] is what row h's output
// accumulators must be multiplied by. t = lane % 4: this thread holds columns 8i + 2t and 8i + 2t + 1
// of every 8-column block i; S's blocks 2ks and 2ks + 1 are P's fragment ks (hopper.cuh's table):
//   p[ks][0]: row g, block 2ks     p[ks][1]: row g + 8, block 2ks
//   p[ks][2]: row g, block 2ks + 1 p[ks][3]: row g + 8, block 2ks + 1
// s is only read, so that the scores of the next tile can already be on their way into it: ptxas
// serializes every wgmma of a pipeline stage in which ordinary instructions write registers a
// wgmma uses (its message C7513), which would undo the intra-warpgroup overlap.
// kMasked is a template parameter, not a run-time flag: a flag is the same for the whole
// warpgroup, but ptxas turned the choice into selects per score (a multiply, a compare and two
// selects each), paid on every tile; the consumer loops pick the masked instance for the tiles
// that need it.
template <typename Element, int kBlockCols, bool kCausal, bool kMasked>
__device__ inline void softmax_tile(const float (&s)[kBlockCols / 2], uint32_t (&p)[kBlockCols / 16][4],
                                    float (&row_max2)[2], float (&row_sum)[2], float (&rescale)[2], int first_key,
                                    int row0, int seq_kv, int diagonal, float positive_scale, int t) {
  constexpr int kKeyBlocks = kBlockCols / 8;
  // The scale multiplies inside the exp2's argument, one FFMA per score; a masked tile scales first,
  // so that the mask's -inf is compared with scaled scores.
  const float score_scale = kMasked ? 1.0f : positive_scale;
  int row_key_end[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) row_key_end[h] = kCausal ? min(seq_kv, row0 + 8 * h + diagonal + 1) : seq_kv;
  // Score (key block kb, row h, element e) as the softmax sees it; on a masked tile, scaled, and -inf
  // past the row's last key.
  auto score = [&](int kb, int h, int e) {
    float x = s[4 * kb + 2 * h + e];
    if constexpr (kMasked) {
      x *= positive_scale;
      if (first_key + 8 * kb + 2 * t + e >= row_key_end[h]) x = -INFINITY;
    }
    return x;
  };
  float offset2[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int kb = 0; kb < kKeyBlocks; ++kb)
#pragma unroll
      for (int e = 0; e < 2; ++e) tile_max = fmaxf(tile_max, score(kb, h, e));
    const float new_max2 = fmaxf(row_max2[h], max_over_row_lanes(tile_max) * score_scale);
    // -inf only while the row has seen no key; 0 then keeps its masked 2^(-inf) at 0.
    offset2[h] = new_max2 == -INFINITY ? 0.0f : new_max2;
    rescale[h] = exp2_approx(row_max2[h] - offset2[h]);
    row_max2[h] = new_max2;
  }
  float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int ks = 0; ks < kBlockCols / 16; ++ks)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int kb = 2 * ks + half;
        const float e0 = exp2_approx(fmaf(score(kb, h, 0), score_scale, -offset2[h]));
        const float e1 = exp2_approx(fmaf(score(kb, h, 1), score_scale, -offset2[h]));
        tile_sum[h] += e0 + e1;
        p[ks][2 * half + h] = pack2<Element>(e0, e1);
      }
#pragma unroll
  for (int h = 0; h < 2; ++h) row_sum[h] = row_sum[h] * rescale[h] + tile_sum[h];
}

// Output accumulators times each row's factor: o[4i + 2h + e] belongs to row h.
template <int kORegs>
__device__ inline void rescale_output(float (&o)[kORegs], const float (&rescale)[2]) {
#pragma unroll
  for (int i = 0; i < kORegs / 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o[4 * i + 2 * h] *= rescale[h];
      o[4 * i + 2 * h + 1] *= rescale[h];
    }
}

// S = Q K^T for one K tile: head_dim / 16 wgmma, the first overwriting S (scale-d false).
template <typename Element, int kHeadDim, class Config>
__device__ inline void issue_scores(float (&s)[Config::kBlockCols / 2], const unsigned char* q_panel0,
                                    const unsigned char* k_panel0) {
  using L = SharedLayout<kHeadDim, Config>;
#pragma unroll
  for (int ks = 0; ks < kHeadDim / kWgmmaK; ++ks)
    hopper::wgmma_ss<Element, Config::kBlockCols, 1, 0>(s, k_major_descriptor<L::kQPanelBytes>(q_panel0, ks),
                                                        k_major_descriptor<L::kKVPanelBytes>(k_panel0, ks), ks > 0);
}

// O += P V for one V tile: Bc / 16 wgmma with P from registers and V MN-major (imm-trans-b = 1).
template <typename Element, int kHeadDim, class Config>
__device__ inline void issue_output(float (&o)[kHeadDim / 2], const uint32_t (&p)[Config::kBlockCols / 16][4],
                                    const unsigned char* v_panel0) {
  using L = SharedLayout<kHeadDim, Config>;
#pragma unroll
  for (int ks = 0; ks < Config::kBlockCols / kWgmmaK; ++ks)
    hopper::wgmma_rs<Element, kHeadDim, 1>(o, p[ks], mn_major_descriptor<L::kKVPanelBytes>(v_panel0, ks), true);
}

// The ring's n-th K/V tile of the block (counted over all its work tiles) goes to buffer n % kStages;
// the buffer's barriers complete once per pass over the ring, so their phase is (n / kStages) % 2.
template <int kStages>
__device__ inline int ring_slot(int n) {
  return n % kStages;
}
template <int kStages>
__device__ inline uint32_t ring_parity(int n) {
  return (n / kStages) & 1;
}

// What a consumer warpgroup needs to know about its work tile.
struct ConsumerWork {
  int consumer;      // which consumer warpgroup, 0 or 1
  int first_row;     // its first query row (the work tile's first row + 64 * consumer)
  int num_tiles;     // K/V tiles of the work tile
  int ring;          // K/V tiles the block's ring carried before this work tile
  int q_round;       // Q tiles the block loaded before this one
  int seq_q, seq_kv;
  float scale_log2;  // softmax scale * log2(e), any sign
};

// The first K/V tile of a consumer warpgroup that needs the mask; every later tile needs it too.
// A tile needs it when it reaches past seq_kv or, causal, past the last key that the warpgroup's
// first row sees (bottom-right: first_row + seq_kv - seq_q).
template <int kBlockCols, bool kCausal>
__device__ inline int first_masked_tile(const ConsumerWork& w) {
  const int key_bound = kCausal ? min(w.seq_kv, max(0, w.first_row + w.seq_kv - w.seq_q + 1)) : w.seq_kv;
  return key_bound / kBlockCols;
}

// The two instances of softmax_tile, as arguments to the consumers' lambdas.
using Masked = std::true_type;
using Unmasked = std::false_type;

// The producer: one thread issues every copy of a work tile: K and V tile by tile through the ring,
// and Q (each consumer's 64 rows, panel by panel, all on q_full) right after the first K tile. For
// each buffer: wait until the consumers have emptied it (on the first pass every buffer is empty:
// parity 1 on a fresh barrier returns at once), announce the tile's bytes on its full barrier, issue
// the copies. K and V have barriers of their own, so that S = Q K^T can start while V is still in
// flight. Q waits for q_empty, the consumers' release of the last work tile's Q; K_0 goes first
// because its buffer is free earlier (kStages K tiles before the end of the last work tile).
// ring, q_round: as in ConsumerWork.
template <typename Element, int kHeadDim, class Config>
__device__ void produce(const Smem<Element, kHeadDim, Config>& sm, const CUtensorMap* q_map, const CUtensorMap* k_map,
                        const CUtensorMap* v_map, int first_row, int q_head, int kv_head, int num_tiles, int ring,
                        int q_round) {
  using L = SharedLayout<kHeadDim, Config>;
  constexpr int kStages = Config::kStages;
  for (int j = 0; j < num_tiles; ++j) {
    const int s = ring_slot<kStages>(ring + j);
    const uint32_t empty_parity = ring_parity<kStages>(ring + j) ^ 1;
    const int first_key = j * Config::kBlockCols;
    mbarrier_wait(sm.k_empty(s), empty_parity);
    mbarrier_arrive_expect_tx(sm.k_full(s), L::kKVBytes);
#pragma unroll
    for (int p = 0; p < L::kPanels; ++p) tma_load_3d(sm.k(s, p), k_map, sm.k_full(s), p * kPanelCols, first_key, kv_head);
    if (j == 0) {
      mbarrier_wait(sm.q_empty(q_round), sm.q_parity(q_round) ^ 1);
      mbarrier_arrive_expect_tx(sm.q_full(q_round), Config::kConsumers * L::kQBytes);
#pragma unroll
      for (int c = 0; c < Config::kConsumers; ++c)
#pragma unroll
        for (int p = 0; p < L::kPanels; ++p)
          tma_load_3d(sm.q(q_round, c, p), q_map, sm.q_full(q_round), p * kPanelCols, first_row + c * kWgmmaM,
                      q_head);
    }
    mbarrier_wait(sm.v_empty(s), empty_parity);
    mbarrier_arrive_expect_tx(sm.v_full(s), L::kKVBytes);
#pragma unroll
    for (int p = 0; p < L::kPanels; ++p) tma_load_3d(sm.v(s, p), v_map, sm.v_full(s), p * kPanelCols, first_key, kv_head);
  }
}

// One arrival per consumer warp (the empty barriers expect 4 per consumer warpgroup): every warp has
// passed its own wgmma.wait_group, so the whole warpgroup's products have finished reading.
__device__ inline void release(uint64_t* empty_barrier, int lane) {
  __syncwarp();
  if (lane == 0) mbarrier_arrive(empty_barrier);
}

// A negative scale goes into Q, as in stage 10 (negation is exact in any float format), so that the
// largest raw score is the largest scaled one and the softmax can use the scale's absolute value.
// Q arrived through the async proxy (the copy engine) and wgmma reads it through the async proxy:
// ordinary stores in between must be followed by fence.proxy.async in every writing thread, then a
// barrier of the warpgroup (warpgroup_sync), before the first wgmma reads.
// The swizzle does not matter here: every element of the tile flips.
template <typename Element, int kHeadDim, class Config>
__device__ void negate_q_tile(const Smem<Element, kHeadDim, Config>& sm, int q_round, int consumer, int thread) {
  using L = SharedLayout<kHeadDim, Config>;
  constexpr uint32_t kSignBits = 0x80008000u;  // the sign bits of two packed 16-bit floats
  uint4* words = reinterpret_cast<uint4*>(sm.q(q_round, consumer, 0));
#pragma unroll
  for (int i = thread; i < L::kQBytes / 16; i += kWarpgroupThreads) {
    uint4 x = words[i];
    x.x ^= kSignBits;
    x.y ^= kSignBits;
    x.z ^= kSignBits;
    x.w ^= kSignBits;
    words[i] = x;
  }
  hopper::fence_proxy_async_shared();
  warpgroup_sync(consumer);
}

// The plain consumer loop (version A, and any configuration without the overlaps): per tile,
// S = Q K^T, wait; softmax; O += P V, wait. The tensor cores idle while the softmax runs, unless
// another block or warpgroup on the SM has products in flight.
template <typename Element, int kHeadDim, bool kCausal, class Config>
__device__ void consume_in_order(const Smem<Element, kHeadDim, Config>& sm, const ConsumerWork& w,
                                 float (&o)[kHeadDim / 2], float (&row_max2)[2], float (&row_sum)[2]) {
  constexpr int kBlockCols = Config::kBlockCols;
  constexpr int kStages = Config::kStages;
  const int thread = threadIdx.x % kWarpgroupThreads;
  const int warp = thread / 32, lane = thread % 32;
  const int row0 = w.first_row + 16 * warp + lane / 4;  // this thread's rows: row0 and row0 + 8
  const int t = lane % 4;
  const int diagonal = w.seq_kv - w.seq_q;
  const float positive_scale = fabsf(w.scale_log2);

  const int first_masked = first_masked_tile<kBlockCols, kCausal>(w);

  float s[kBlockCols / 2] = {};
  uint32_t p[kBlockCols / 16][4];
  // Tile j, written once for both kinds of tile: masked is Masked or Unmasked.
  auto step = [&](int j, auto masked) {
    const int st = ring_slot<kStages>(w.ring + j);
    const uint32_t full_parity = ring_parity<kStages>(w.ring + j);
    const int first_key = j * kBlockCols;

    mbarrier_wait(sm.k_full(st), full_parity);
    wgmma_fence();  // s and o were written by ordinary instructions since the last products
    issue_scores<Element, kHeadDim, Config>(s, sm.q(w.q_round, w.consumer, 0), sm.k(st, 0));
    wgmma_commit_group();
    wgmma_wait_group<0>();
    fence_registers(s);
    release(sm.k_empty(st), lane);

    float rescale[2];
    softmax_tile<Element, kBlockCols, kCausal, decltype(masked)::value>(s, p, row_max2, row_sum, rescale, first_key,
                                                                        row0, w.seq_kv, diagonal, positive_scale, t);
    rescale_output(o, rescale);

    mbarrier_wait(sm.v_full(st), full_parity);
    wgmma_fence();
    issue_output<Element, kHeadDim, Config>(o, p, sm.v(st, 0));
    wgmma_commit_group();
    wgmma_wait_group<0>();
    fence_registers(o);
    fence_registers(p);
    release(sm.v_empty(st), lane);
  };
  mbarrier_wait(sm.q_full(w.q_round), sm.q_parity(w.q_round));
  if (w.scale_log2 < 0.0f) negate_q_tile(sm, w.q_round, w.consumer, thread);
  int j = 0;
  for (; j < first_masked && j < w.num_tiles; ++j) step(j, Unmasked{});
  for (; j < w.num_tiles; ++j) step(j, Masked{});
  // Every product that reads Q has finished; with kTmaStore the buffer holds O first, and
  // store_output_tma releases it.
  if constexpr (!Config::kTmaStore) release(sm.q_empty(w.q_round), lane);
}

// The overlapped consumer loop (version B). Iteration j issues S_j = Q K_j^T and, behind it,
// O += P_{j-1} V_{j-1}, the product of the tile before, so that the two are on the tensor cores
// together:
//   kIntraOverlap: the softmax of S_j runs while O += P_{j-1} V_{j-1} is still in flight
//     (wgmma.wait_group 1 waits for S_j alone); O is rescaled only after the wait for everything
//     (wait_group 0), since that product still accumulates into O. P_j cannot overwrite P_{j-1},
//     which the product is reading: P has two buffers, used in turn (the loop body is written out
//     twice, so that each buffer stays in its own registers; a copy from one to the other made ptxas
//     serialize the products, its message C7513). The wait_group 0, the release of V_{j-1} and the
//     rescale (finish_output) come at the start of iteration j + 1, after its waits for the next K
//     and V tiles, not right after the softmax: there, ptxas scheduled the wait (WARPGROUP.DEPBAR)
//     ahead of the softmax's exponentials, which then waited for the product instead of overlapping
//     it. The mbarrier waits are loops, and ptxas kept the wait below them (scripts/profile/sass_overlap.sh
//     checks the machine code).
//   kPingPong: the two consumer warpgroups issue their products in turns. Consumer c waits on named
//     barrier kTurnBarrier + c before it issues, and arrives on the other's barrier after: while
//     one runs its softmax, the other's products run. Consumer 1 arrives once before its first
//     turn, so that consumer 0 goes first; consumer 0 takes one last turn at the end, which absorbs
//     consumer 1's last arrival, so both barriers end as they started. With kBackToBack the kernel
//     does both, once for all its work tiles: the turns run on from one work tile to the next.
// Tile 0 is taken apart before the loop (no product before it), so that no branch sits between a
// wgmma and its wait inside an iteration. behind_first_scores() runs while tile 0's scores are on
// the tensor cores (it must not touch s); after_first_tile() once tile 0's softmax is done.
template <typename Element, int kHeadDim, bool kCausal, class Config, class BehindFirstScores, class AfterFirstTile>
__device__ void consume_overlapped(const Smem<Element, kHeadDim, Config>& sm, const ConsumerWork& w,
                                   float (&o)[kHeadDim / 2], float (&row_max2)[2], float (&row_sum)[2],
                                   BehindFirstScores behind_first_scores, AfterFirstTile after_first_tile) {
  constexpr bool kTurnsPerWorkTile = Config::kPingPong && !Config::kBackToBack;
  constexpr int kBlockCols = Config::kBlockCols;
  constexpr int kStages = Config::kStages;
  using Operand = uint32_t[kBlockCols / 16][4];
  const int thread = threadIdx.x % kWarpgroupThreads;
  const int warp = thread / 32, lane = thread % 32;
  const int row0 = w.first_row + 16 * warp + lane / 4;
  const int t = lane % 4;
  const int diagonal = w.seq_kv - w.seq_q;
  const float positive_scale = fabsf(w.scale_log2);
  const int first_masked = first_masked_tile<kBlockCols, kCausal>(w);

  float s[kBlockCols / 2] = {};
  Operand p_even = {}, p_odd = {};  // P of the even and of the odd tiles
  auto softmax = [&](auto masked, int first_key, Operand& p_out, float(&rescale)[2]) {
    softmax_tile<Element, kBlockCols, kCausal, decltype(masked)::value>(s, p_out, row_max2, row_sum, rescale,
                                                                        first_key, row0, w.seq_kv, diagonal,
                                                                        positive_scale, t);
  };
  auto slot = [&](int j) { return ring_slot<kStages>(w.ring + j); };
  auto parity = [&](int j) { return ring_parity<kStages>(w.ring + j); };
  mbarrier_wait(sm.q_full(w.q_round), sm.q_parity(w.q_round));
  if (w.scale_log2 < 0.0f) negate_q_tile(sm, w.q_round, w.consumer, thread);
  if (kTurnsPerWorkTile && w.consumer == 1) pass_turn(1);  // consumer 0 goes first

  // kIntraOverlap: the rescale factors of the last softmax, applied by finish_output once the
  // product that reads the output before them is done.
  float pending_rescale[2];
  // kIntraOverlap: wait for the P V product in flight (which read p_read), release its V tile
  // (j_done, -1 when there was none) and rescale O. The fence on O keeps the multiplications before
  // the next wgmma_fence: LLVM otherwise sinks them next to the product that reads O, and ptxas then
  // inserts a warpgroup.arrive of its own (message C7519).
  auto finish_output = [&](int j_done, Operand& p_read) {
    wgmma_wait_group<0>();
    fence_registers(o);
    fence_registers(p_read);
    if (j_done >= 0) release(sm.v_empty(slot(j_done)), lane);
    rescale_output(o, pending_rescale);
    fence_registers(o);
  };
  // Tile 0: its scores, then its softmax into p_even; there is no product before it to overlap.
  {
    mbarrier_wait(sm.k_full(slot(0)), parity(0));
    if (Config::kPingPong) wait_for_turn(w.consumer);
    wgmma_fence();
    issue_scores<Element, kHeadDim, Config>(s, sm.q(w.q_round, w.consumer, 0), sm.k(slot(0), 0));
    wgmma_commit_group();
    if (Config::kPingPong) pass_turn(w.consumer);
    behind_first_scores();
    wgmma_wait_group<0>();
    fence_registers(s);
    release(sm.k_empty(slot(0)), lane);
    // Its factors are 0 (no row had a maximum before this tile); finish_output applies them to an
    // output that is still 0.
    if (first_masked == 0)
      softmax(Masked{}, 0, p_even, pending_rescale);
    else
      softmax(Unmasked{}, 0, p_even, pending_rescale);
  }
  after_first_tile();

  // Tile j: S_j and P_{j-1} V_{j-1} on the tensor cores, then the softmax of S_j into p_out; masked
  // is Masked or Unmasked, fixed for the whole loop that calls step, so that no branch sits between
  // a wgmma and its wait.
  auto step = [&](int j, Operand& p_in, Operand& p_out, auto masked) {
    const int st = slot(j), prev = slot(j - 1);
    const int first_key = j * kBlockCols;
    mbarrier_wait(sm.k_full(st), parity(j));
    mbarrier_wait(sm.v_full(prev), parity(j - 1));
    // P_{j-2} V_{j-2}, issued in the iteration before, read the buffer that P_j goes into.
    if constexpr (Config::kIntraOverlap) finish_output(j - 2, p_out);
    if (Config::kPingPong) wait_for_turn(w.consumer);
    wgmma_fence();
    issue_scores<Element, kHeadDim, Config>(s, sm.q(w.q_round, w.consumer, 0), sm.k(st, 0));
    wgmma_commit_group();
    issue_output<Element, kHeadDim, Config>(o, p_in, sm.v(prev, 0));
    wgmma_commit_group();
    if (Config::kPingPong) pass_turn(w.consumer);
    if constexpr (Config::kIntraOverlap) {
      wgmma_wait_group<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
      fence_registers(s);
      release(sm.k_empty(st), lane);
      softmax(masked, first_key, p_out, pending_rescale);
    } else {
      float rescale[2];
      wgmma_wait_group<0>();
      fence_registers(s);
      fence_registers(o);
      fence_registers(p_in);
      release(sm.k_empty(st), lane);
      release(sm.v_empty(prev), lane);
      softmax(masked, first_key, p_out, rescale);
      rescale_output(o, rescale);
    }
  };
  // The tiles without the mask first, then the rest with it, each loop in pairs so that P's buffers
  // keep their roles: when the unmasked tiles after tile 0 are odd in number, the last of them runs
  // masked, which costs time but changes nothing. kLeftoverUnmasked: unless no tile needs the mask
  // (not causal, seq_kv a multiple of Bc), where it runs unmasked on its own. (Causal kernels leave
  // the instance out: their last tile nearly always needs the mask, and with the instance in they
  // measured 0.96x to 1.01x, docs/experiments/stage12.md.)
  int j = 1;
  for (; j + 1 < first_masked; j += 2) {
    step(j, p_even, p_odd, Unmasked{});
    step(j + 1, p_odd, p_even, Unmasked{});
  }
  for (; j + 1 < w.num_tiles; j += 2) {
    step(j, p_even, p_odd, Masked{});
    step(j + 1, p_odd, p_even, Masked{});
  }
  if (Config::kLeftoverUnmasked && !kCausal && j < first_masked) {
    if (j < w.num_tiles) step(j, p_even, p_odd, Unmasked{});
  } else if (j < w.num_tiles) {
    step(j, p_even, p_odd, Masked{});
  }

  // The last tile's O += P V. Its P is in p_odd when the last tile's index is odd: selected into
  // p_even without a branch (a wgmma on each side of one made ptxas serialize them, message C7520).
  const int last = w.num_tiles - 1;
  const int st = slot(last);
  const bool odd = last % 2 == 1;
  mbarrier_wait(sm.v_full(st), parity(last));
  if constexpr (Config::kIntraOverlap) {
    // The product in flight read P_{last-1}: p_even when last is odd, p_odd when it is even.
    finish_output(last - 1, p_even);
    fence_registers(p_odd);
  }
  if (Config::kPingPong) wait_for_turn(w.consumer);
#pragma unroll
  for (int ks = 0; ks < kBlockCols / 16; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e) p_even[ks][e] = odd ? p_odd[ks][e] : p_even[ks][e];
  wgmma_fence();
  issue_output<Element, kHeadDim, Config>(o, p_even, sm.v(st, 0));
  wgmma_commit_group();
  if (Config::kPingPong) pass_turn(w.consumer);
  wgmma_wait_group<0>();
  fence_registers(o);
  release(sm.v_empty(st), lane);
  if (kTurnsPerWorkTile && w.consumer == 0) wait_for_turn(0);  // consumer 1's last pass
  // Q may be overwritten: every product that reads it has finished, and (ping-pong, turns per work
  // tile) consumer 0 has taken consumer 1's last pass, so the turns start the next work tile as they
  // started this one.
  // With kTmaStore the buffer holds O first: store_output_tma releases it.
  if constexpr (!Config::kTmaStore) release(sm.q_empty(w.q_round), lane);
}

// What the output of a row is multiplied by: 1 / sum, or 0 for a row that saw no key (its O is zeros).
__device__ inline float row_normalizer(float sum) { return sum > 0.0f ? 1.0f / sum : 0.0f; }

// lse = ln(sum 2^(s2 - max2) * 2^max2) = (max2 + log2(sum)) * ln 2; -inf for a row that saw no key.
__device__ inline float row_lse(float row_max2, float sum) {
  return sum > 0.0f ? (row_max2 + log2f(sum)) * kLn2 : -INFINITY;
}

// O normalized and rounded to Element, lse in base e; rows past seq_q are not written. Each thread
// writes two adjacent elements per 8-column block of its two rows (stage 10's store).
template <typename Element, int kHeadDim>
__device__ inline void store_output(Element* o_head, float* lse_head, const float (&o)[kHeadDim / 2],
                                    const float (&row_max2)[2], const float (&row_sum)[2], int row0, int seq_q,
                                    int t) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = sum_over_row_lanes(row_sum[h]);
    const int row = row0 + 8 * h;
    if (row >= seq_q) continue;
    const float normalizer = row_normalizer(sum);
    Element* o_row = o_head + static_cast<long long>(row) * kHeadDim;
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i)
      *reinterpret_cast<uint32_t*>(o_row + 8 * i + 2 * t) =
          pack2<Element>(o[4 * i + 2 * h] * normalizer, o[4 * i + 2 * h + 1] * normalizer);
    if (lse_head && t == 0) lse_head[row] = row_lse(row_max2[h], sum);
  }
}

// O normalized and rounded to Element, as kTmaStore's epilogue writes it: words[h][i] holds this
// thread's two adjacent elements of 8-column block i of its row h; sum[h] is the row's sum over its
// 4 threads. (Ordinary instructions define these registers: kStoreBehindScores keeps them while
// the next work tile's scores are in flight, where the output accumulators themselves, defined by
// wgmma, made ptxas wait for the scores first, its message C7517.)
template <int kHeadDim>
struct RoundedOutput {
  uint32_t words[2][kHeadDim / 8];
  float row_max2[2], sum[2];
};

template <typename Element, int kHeadDim>
__device__ inline RoundedOutput<kHeadDim> round_output(const float (&o)[kHeadDim / 2], const float (&row_max2)[2],
                                                      const float (&row_sum)[2]) {
  RoundedOutput<kHeadDim> r;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    r.sum[h] = sum_over_row_lanes(row_sum[h]);
    r.row_max2[h] = row_max2[h];
    const float normalizer = row_normalizer(r.sum[h]);
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i)
      r.words[h][i] = pack2<Element>(o[4 * i + 2 * h] * normalizer, o[4 * i + 2 * h + 1] * normalizer);
  }
  return r;
}

// kTmaStore's epilogue. The warpgroup writes its O tile (round_output) into its own Q buffer in the
// layout the copy engine loaded Q in: 64-column panels of 128-byte rows, the 16-byte chunk c of row r
// at chunk c ^ (r % 8) (the 128-byte swizzle). Each warp store is then free of bank conflicts: its 8
// rows put their chunks in 8 different places of the 128-byte line. After a proxy fence and the
// warpgroup's barrier, one thread issues the TMA store of each panel; the copy engine skips the rows
// past seq_q (outside the tensor map) and writes whole 128-byte lines, where the per-thread stores of
// store_output write 16 bytes of each of 8 rows per instruction. The same thread releases Q's buffer
// once the engine has read it (bulk_wait_read), which a block must also wait for before it exits. lse
// is written as in store_output. With kBackToBack the thread does not wait here: the copy engine
// reads while the warpgroup starts its next work tile, and the kernel waits and releases the buffer
// during that work tile (the consumer loop's release_stored_q).
template <typename Element, int kHeadDim, class Config>
__device__ inline void store_output_tma(const Smem<Element, kHeadDim, Config>& sm, const CUtensorMap* o_map,
                                        int q_round, int consumer, int first_row, int bh, float* lse_head,
                                        const RoundedOutput<kHeadDim>& out, int seq_q) {
  using L = SharedLayout<kHeadDim, Config>;
  constexpr int kChunkBytes = 16;  // the unit the 128-byte swizzle permutes (kSwizzleBytes)
  constexpr int kChunksPerRow = kSwizzleBytes / kChunkBytes;  // 8: one chunk per 8-column block
  const int thread = threadIdx.x % kWarpgroupThreads;
  const int warp = thread / 32, lane = thread % 32;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int tile_row = 16 * warp + g + 8 * h;               // tile_row % 8 == g
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) {
      unsigned char* line = sm.q(q_round, consumer, i / kChunksPerRow) + tile_row * kSwizzleBytes;
      *reinterpret_cast<uint32_t*>(line + ((i % kChunksPerRow) ^ g) * kChunkBytes + 4 * t) = out.words[h][i];
    }
    const int row = first_row + tile_row;
    if (lse_head && t == 0 && row < seq_q) lse_head[row] = row_lse(out.row_max2[h], out.sum[h]);
  }
  hopper::fence_proxy_async_shared();  // the stores above, before the copy engine reads them
  warpgroup_sync(consumer);
  if (thread == 0) {
#pragma unroll
    for (int p = 0; p < L::kPanels; ++p)
      hopper::tma_store_3d(o_map, sm.q(q_round, consumer, p), p * kPanelCols, first_row, bh);
    hopper::bulk_commit();
    if constexpr (!Config::kBackToBack) {
      hopper::bulk_wait_read<0>();
      mbarrier_arrive(sm.q_empty(q_round));
    }
  }
}

// The work units of a grid: each a work tile (Br query rows of one head) when tiles_per_unit is 1,
// or a pair of them when it is 2, the query tiles i and num_q_tiles - 1 - i of one head. A causal
// pair sees as many K/V tiles as any other, so blocks that take one pair each in turn end together
// without a longest-first order across heads; and the pairs come head by head, so the blocks in
// flight read the K and V of a few heads, which stay in L2, where longest first runs one query tile
// of every head at once.
// With pairs, the last tail_heads heads come after the pairs of all the others, one query tile a
// unit, longest first across those heads: units of one tile and of every length let the blocks of the
// last pass end together, where pairs, all of the same size, left the SMs without a pair idle.
// Fewer than 2^31 of them: num_heads_total * num_q_tiles <= batch * heads_q * seq_q, which
// flash::check_forward_args keeps within kMaxDim.
__host__ __device__ inline int units_per_head(int num_q_tiles, int tiles_per_unit) {
  return tiles_per_unit == 2 ? (num_q_tiles + 1) / 2 : num_q_tiles;
}
__host__ __device__ inline int num_pair_units(int num_heads_total, int num_q_tiles, int tiles_per_unit,
                                              int tail_heads) {
  return (num_heads_total - tail_heads) * units_per_head(num_q_tiles, tiles_per_unit);
}
__host__ __device__ inline int num_work_units(int num_heads_total, int num_q_tiles, int tiles_per_unit,
                                              int tail_heads) {
  return num_pair_units(num_heads_total, num_q_tiles, tiles_per_unit, tail_heads) + tail_heads * num_q_tiles;
}

// A division by a number that is the same for the whole grid (a head count, the units per head), as
// a multiply-high, an add and a shift: the division instruction sequence is a chain of a reciprocal
// and corrections on every work tile's search, which the consumers wait for between work tiles.
// Granlund and Montgomery's round-up method ("Division by invariant integers using multiplication",
// 1994): with shift = ceil(log2 d) and multiplier = floor(2^32 (2^shift - d) / d) + 1,
// n / d = (umulhi(n, multiplier) + n) >> shift for every n < 2^31 (the sum then fits 32 bits).
struct GridDivisor {
  uint32_t divisor, multiplier, shift;
};

__host__ inline GridDivisor make_grid_divisor(int d) {
  GridDivisor g{static_cast<uint32_t>(d), 0, 0};
  while ((1ull << g.shift) < g.divisor) ++g.shift;
  g.multiplier = static_cast<uint32_t>(((1ull << 32) * ((1ull << g.shift) - g.divisor)) / g.divisor + 1);
  return g;
}

// n / g.divisor for 0 <= n < 2^31; remainder() gives n % g.divisor from that quotient.
__device__ inline int divide(int n, const GridDivisor& g) {
  const uint32_t u = static_cast<uint32_t>(n);
  return static_cast<int>((__umulhi(u, g.multiplier) + u) >> g.shift);
}
__device__ inline int remainder(int n, int quotient, const GridDivisor& g) {
  return n - quotient * static_cast<int>(g.divisor);
}

}  // namespace kernel_detail

// One work unit (num_work_units) per (batch, query head, query tile of Config::kBlockRows rows),
// numbered as stage 10's grid: causal runs the longest tiles of every head first; or, with
// tiles_per_unit 2, one per pair of query tiles, head by head, then the tail_heads heads of the tail
// one tile at a time (num_work_units). Block b takes work unit b when the grid
// has a block per unit; with one block per SM (persistent), one in each pass over the grid, in
// serpentine order (unit_of_pass). q_map, k_map, v_map, o_map: 3-D tensor maps (head_dim, sequence,
// batch * heads) over q, k, v, o with boxes of (64, 64 or Bc, 1), 128-byte swizzle (ladder.cu makes
// them; o_map is used by kTmaStore only). The K/V head of query head h is an index into k_map and
// v_map (GQA).
template <typename Element, int kHeadDim, bool kCausal, class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    ladder_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                  const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap o_map, Element* o,
                  float* lse, int heads_q, int heads_kv, int seq_q, int seq_kv, float scale_log2, int num_q_tiles,
                  int num_heads_total, int tiles_per_unit, int tail_heads, kernel_detail::GridDivisor unit_divisor,
                  kernel_detail::GridDivisor heads_q_divisor, kernel_detail::GridDivisor group_divisor,
                  kernel_detail::GridDivisor tail_divisor) {
#if FLASH_HOPPER_SM90A
  using namespace kernel_detail;
  static_assert(sizeof(Element) == kElementBytes, "16-bit elements");
  extern __shared__ unsigned char shared_raw[];
  const Smem<Element, kHeadDim, Config> sm(shared_raw);

  if (threadIdx.x == 0) {
    for (int r = 0; r < Config::kQStages; ++r) {
      hopper::mbarrier_init(sm.q_full(r), 1);  // the producer's arrive.expect_tx; the bytes complete it
      // One arrival per consumer warp; with kTmaStore, one per consumer warpgroup (store_output_tma).
      hopper::mbarrier_init(sm.q_empty(r), (Config::kTmaStore ? 1 : 4) * Config::kConsumers);
    }
    for (int s = 0; s < Config::kStages; ++s) {
      hopper::mbarrier_init(sm.k_full(s), 1);
      hopper::mbarrier_init(sm.v_full(s), 1);
      hopper::mbarrier_init(sm.k_empty(s), 4 * Config::kConsumers);
      hopper::mbarrier_init(sm.v_empty(s), 4 * Config::kConsumers);
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();

  // Work tile (bh, q_tile): which rows of which head, and how many K/V tiles they see.
  struct WorkTile {
    int bh;  // batch * heads_q + query head
    int first_row, kv_head, num_tiles;
  };
  auto work_tile = [&](int bh, int q_tile) {
    WorkTile t;
    t.bh = bh;
    t.first_row = q_tile * Config::kBlockRows;
    const int b = divide(bh, heads_q_divisor);
    const int h = remainder(bh, b, heads_q_divisor);
    t.kv_head = b * heads_kv + divide(h, group_divisor);  // flash::kv_head_of
    const int last_row = min(t.first_row + Config::kBlockRows, seq_q) - 1;
    const int key_end = kCausal ? min(seq_kv, flash::causal_key_end(last_row, seq_q, seq_kv)) : seq_kv;
    t.num_tiles = key_end > 0 ? (key_end + Config::kBlockCols - 1) / Config::kBlockCols : 0;
    return t;
  };
  const int num_units = num_work_units(num_heads_total, num_q_tiles, tiles_per_unit, tail_heads);
  const int pair_units = num_pair_units(num_heads_total, num_q_tiles, tiles_per_unit, tail_heads);
  // Block b's work unit in pass p over the grid: b in even passes, gridDim.x - 1 - b in odd ones (a
  // serpentine order). Causal work tiles come longest first, so the block that takes a pass's longest
  // tile takes the next pass's shortest, and the blocks of a persistent grid end at about the same
  // time; in the order b, b + gridDim.x, ... block 0 took the longest tile of every pass. A grid with a
  // block per work unit has one pass.
  // Unsigned: past the last unit, a pass's index may reach num_units + gridDim.x - 1 > 2^31 - 1.
  const unsigned grid = gridDim.x, block = blockIdx.x;
  const int num_passes = static_cast<int>((static_cast<unsigned>(num_units) + grid - 1) / grid);
  auto unit_of_pass = [&](int pass) {
    return static_cast<unsigned>(pass) * grid + (pass % 2 == 0 ? block : grid - 1 - block);
  };
  // The block's step-th work tile: the first or second of pass step / tiles_per_unit's unit. False
  // when there is none: past the last unit, the second of a pair that is one tile, or the second step
  // of a unit of the tail, which is one tile. unit_divisor divides by the units of a head
  // (pairs_per_head or num_q_tiles), or, causal one tile at a time, by the heads; tail_divisor by
  // tail_heads.
  const int num_steps = num_passes * tiles_per_unit;
  auto work_tile_of_step = [&](int step, WorkTile& t) {
    const bool pairs = tiles_per_unit == 2;
    const unsigned next = unit_of_pass(pairs ? step / 2 : step);
    if (next >= static_cast<unsigned>(num_units)) return false;
    const int unit = static_cast<int>(next);
    const bool second = pairs && step % 2 == 1;
    int bh, q_tile;
    if (unit >= pair_units) {
      // The tail (pairs only): level l holds query tile num_q_tiles - 1 - l of each of its heads.
      if (second) return false;
      const int tail_unit = unit - pair_units;
      const int level = divide(tail_unit, tail_divisor);
      bh = num_heads_total - tail_heads + remainder(tail_unit, level, tail_divisor);
      q_tile = num_q_tiles - 1 - level;
    } else {
      const int quotient = divide(unit, unit_divisor);
      const int rest = remainder(unit, quotient, unit_divisor);
      if (pairs) {
        // Pair i = rest of head quotient: query tile num_q_tiles - 1 - i, then tile i. Causal, the two
        // see num_q_tiles + 1 K/V tiles together (with Br = Bc and seq_q = seq_kv), whatever i is.
        bh = quotient;
        const int i = rest;
        if (second && i == num_q_tiles - 1 - i) return false;  // the middle tile of an odd count
        q_tile = second ? i : num_q_tiles - 1 - i;
      } else if (kCausal) {
        bh = rest;
        q_tile = num_q_tiles - 1 - quotient;
      } else {
        bh = quotient;
        q_tile = rest;
      }
    }
    t = work_tile(bh, q_tile);
    return true;
  };
  // Both roles walk the same work tiles and count the same K/V tiles (ring) and Q tiles (q_round),
  // so their barrier phases agree without talking.
  // threadIdx.x / 128 as lane 0 has it: the same number, but one that ptxas knows is the same in all
  // 32 lanes, and so is what follows from it (a consumer's rows, its first masked K/V tile, its K/V
  // loops' bounds and counter). The loops' barrier addresses and wgmma descriptors then stay in
  // uniform registers instead of being computed per thread and copied over (R2UR) (docs/experiments/stage12.md).
  const int warpgroup = __shfl_sync(kFullWarp, threadIdx.x / kWarpgroupThreads, 0);
  if (warpgroup == Config::kConsumers) {
    // The producer. With kRegisterSplit it is a whole warpgroup, all of which must execute
    // setmaxnreg; one thread issues the copies either way.
    if constexpr (Config::kRegisterSplit) hopper::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x % kWarpgroupThreads != 0) return;
    int ring = 0, q_round = 0;
    for (int step = 0; step < num_steps; ++step) {
      WorkTile t;
      if (!work_tile_of_step(step, t) || t.num_tiles == 0) continue;
      produce<Element, kHeadDim, Config>(sm, &q_map, &k_map, &v_map, t.first_row, t.bh, t.kv_head,
                                         t.num_tiles, ring, q_round);
      ring += t.num_tiles;
      ++q_round;
    }
  } else {
    if constexpr (Config::kRegisterSplit) hopper::setmaxnreg_inc<kConsumerRegisters>();
    // kBackToBack: the turns are set up once for the kernel instead of per work tile
    // (consume_overlapped): consumer 1 passes here, so that consumer 0 goes first, and consumer 0
    // takes consumer 1's last pass after the loop.
    if (Config::kBackToBack && warpgroup == 1) pass_turn(1);
    // kBackToBack: the Q round whose O the copy engine may still be reading, -1 if none. Its buffer
    // is next loaded two Q rounds later, when the producer is kStages K/V tiles from the end of the
    // next work tile; releasing it after the next work tile's first tile leaves the producer free.
    int stored_round = -1;
    auto release_stored_q = [&] {
      if constexpr (Config::kBackToBack) {
        if (stored_round >= 0 && threadIdx.x % kWarpgroupThreads == 0) {
          hopper::bulk_wait_read<0>();  // by now, long done
          mbarrier_arrive(sm.q_empty(stored_round));
        }
        stored_round = -1;
      }
    };
    // kStoreBehindScores: the last work tile's output, rounded (round -1 when there is none), stored
    // while the next work tile's first scores are on the tensor cores (consume_overlapped's
    // behind_first_scores), or after the loop: its writes to shared memory, the proxy fence and the
    // warpgroup's barrier then no longer stand between the last P V product and the next S = Q K^T.
    struct FinishedOutput {
      RoundedOutput<kHeadDim> out;
      int round = -1, first_row, bh;
    } finished;
    auto store_finished = [&] {
      if constexpr (Config::kStoreBehindScores) {
        if (finished.round < 0) return;
        release_stored_q();
        float* lse_head = lse ? lse + static_cast<long long>(finished.bh) * seq_q : nullptr;
        store_output_tma<Element, kHeadDim, Config>(sm, &o_map, finished.round, warpgroup, finished.first_row,
                                                    finished.bh, lse_head, finished.out, seq_q);
        stored_round = finished.round;
        finished.round = -1;
      }
    };
    int ring = 0, q_round = 0;
    for (int step = 0; step < num_steps; ++step) {
      WorkTile t;
      if (!work_tile_of_step(step, t)) continue;
      ConsumerWork w;
      w.consumer = warpgroup;
      w.first_row = t.first_row + warpgroup * kWgmmaM;
      w.num_tiles = t.num_tiles;
      w.ring = ring;
      w.q_round = q_round;
      w.seq_q = seq_q;
      w.seq_kv = seq_kv;
      w.scale_log2 = scale_log2;
      float acc_o[kHeadDim / 2] = {};
      // Base-2 statistics of this thread's two rows: row_max2 = max of s * scale_log2, row_sum =
      // this thread's share of sum 2^(s2 - row_max2), summed over the row's 4 threads at the end.
      float row_max2[2] = {-INFINITY, -INFINITY};
      float row_sum[2] = {0.0f, 0.0f};
      if (t.num_tiles > 0) {
        if constexpr (Config::kPingPong || Config::kIntraOverlap)
          consume_overlapped<Element, kHeadDim, kCausal, Config>(sm, w, acc_o, row_max2, row_sum, store_finished,
                                                                 release_stored_q);
        else
          consume_in_order<Element, kHeadDim, kCausal, Config>(sm, w, acc_o, row_max2, row_sum);
        ring += t.num_tiles;
        ++q_round;
        if constexpr (Config::kStoreBehindScores) {
          // Stored by store_finished. (Kept in this branch, right after consume_overlapped, so that the
          // compiler sees the kept output replaced on every path from the store in the next work
          // tile: otherwise both outputs stay live through the K/V loop.)
          finished.out = round_output<Element, kHeadDim>(acc_o, row_max2, row_sum);
          finished.round = w.q_round;
          finished.first_row = w.first_row;
          finished.bh = t.bh;
          continue;
        }
      }
      float* lse_head = lse ? lse + static_cast<long long>(t.bh) * seq_q : nullptr;
      if (Config::kTmaStore && t.num_tiles > 0) {
        // (A work tile that sees no key has no Q round: the producer skipped it, and its zeros go
        // out through store_output, which leaves Q's buffer and q_empty alone.)
        store_output_tma<Element, kHeadDim, Config>(sm, &o_map, w.q_round, warpgroup, w.first_row, t.bh, lse_head,
                                                    round_output<Element, kHeadDim>(acc_o, row_max2, row_sum), seq_q);
        if constexpr (Config::kBackToBack) stored_round = w.q_round;
      } else {
        const int lane = threadIdx.x % 32;
        const int row0 = w.first_row + 16 * ((threadIdx.x % kWarpgroupThreads) / 32) + lane / 4;
        Element* o_head = o + static_cast<long long>(t.bh) * seq_q * kHeadDim;
        store_output<Element, kHeadDim>(o_head, lse_head, acc_o, row_max2, row_sum, row0, seq_q, lane % 4);
      }
    }
    // kBackToBack: the last store read before the block's shared memory goes, and consumer 1's last
    // pass taken, so that both turn barriers end as they started.
    store_finished();
    release_stored_q();
    if (Config::kBackToBack && warpgroup == 0) wait_for_turn(0);
  }
#else
  // Compiled for another target: never launched (stage12_ladder::forward_variant refuses first).
  (void)q_map, (void)k_map, (void)v_map, (void)o_map, (void)o, (void)lse, (void)heads_q, (void)heads_kv;
  (void)seq_q, (void)seq_kv, (void)scale_log2, (void)num_q_tiles, (void)num_heads_total, (void)tiles_per_unit;
  (void)tail_heads, (void)unit_divisor, (void)heads_q_divisor, (void)group_divisor, (void)tail_divisor;
#endif
}

}  // namespace stage12_ladder

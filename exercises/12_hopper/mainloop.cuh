// What stage 12's two kernels share: the tile shape, the shared-memory layout and its barriers, the
// wgmma descriptors and products, the producer's copies, and the online softmax on the accumulator
// fragments. in_order_kernel.cuh and pingpong_kernel.cuh put these together in their own order;
// epilogue.cuh writes the output.
#pragma once

#include <type_traits>

#include "flash_stage.cuh"
#include "hopper.cuh"
#include "tensor_core.cuh"
#include "tile_scheduler.cuh"

namespace stage12 {

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
using tensor_core::kFullWarp;
using tensor_core::kLn2;
using tensor_core::kLog2e;
using tensor_core::max_over_row_lanes;
using tensor_core::pack2;
using tensor_core::sum_over_row_lanes;

constexpr int kWarpgroupThreads = 128;  // 4 warps: the unit that issues a wgmma
constexpr int kWgmmaM = 64;             // the M of wgmma.m64nNk16: one warpgroup's query rows
constexpr int kWgmmaK = 16;             // its K, for 16-bit inputs
constexpr int kElementBytes = 2;        // fp16, bf16
constexpr int kSwizzleBytes = 128;      // CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunks swizzled within 128 bytes
constexpr int kPanelCols = kSwizzleBytes / kElementBytes;  // 64 elements: the widest box row the swizzle allows
constexpr int kAtomBytes = 8 * kSwizzleBytes;  // 1024: 8 rows of 128 bytes, where the swizzle pattern repeats
constexpr int kKStepBytes = kWgmmaK * kElementBytes;  // 32: how far one k-step moves along a K-major row
// Named barriers 3 and 4: consumer 0's, consumer 1's own 128 threads, after a negative scale was
// folded into their Q tile and after they wrote their O tile (store_output_tma). Barrier 0 belongs to
// __syncthreads(); 16 exist per CTA (PTX ISA, bar/barrier); the ping-pong kernel's turns take 1 and 2.
constexpr int kWarpgroupBarrier = 3;

// The 128 threads of consumer warpgroup `consumer` wait for one another. The ids are immediates
// (hopper.cuh says why), hence the branch on the consumer.
__device__ inline void warpgroup_sync(int consumer) {
  if (consumer == 0)
    hopper::named_barrier_sync<kWarpgroupBarrier + 0, kWarpgroupThreads>();
  else
    hopper::named_barrier_sync<kWarpgroupBarrier + 1, kWarpgroupThreads>();
}

// A kernel's tiles. The consumer warpgroups come first in the block (warpgroups 0 .. kConsumers - 1,
// each starting at a warp index divisible by 4, as wgmma requires), the producer after them.
//   kConsumers: consumer warpgroups, 64 query rows each (Br = 64 * kConsumers).
//   kBlockCols: keys per K/V tile (Bc), the N of S = Q K^T: 128 or 160.
//   kQStages: Q buffers; two let a persistent block load the next work tile's Q while the consumers
//     still work on this one's.
// K and V go through a ring of two buffers each (kStages) between the producer and the consumers.
template <int kConsumers_, int kBlockCols_, int kQStages_>
struct TileShape {
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBlockRows = kWgmmaM * kConsumers;
  static constexpr int kBlockCols = kBlockCols_;
  static constexpr int kStages = 2;
  static constexpr int kQStages = kQStages_;
  static_assert(kConsumers == 1 || kConsumers == 2, "one or two consumer warpgroups");
  static_assert(kBlockCols == 128 || kBlockCols == 160, "the wgmma wrappers have N = 128 and 160");
  static_assert(kQStages == 1 || kQStages == 2, "one or two Q buffers");
};

// Where everything lives in the block's dynamic shared memory. Each tile is stored as kPanels
// column panels of 64 elements (128 bytes a row): the 128-byte swizzle holds rows of at most 128
// bytes (cuTensorMapEncodeTiled: the box's inner dimension <= the swizzle size), so head_dim 128 is
// two panels, each its own TMA box. Every panel starts on a 1024-byte boundary, where the swizzle
// pattern starts, so the descriptors' base offset is 0.
template <int kHeadDim, class Shape>
struct SharedLayout {
  static constexpr int kPanels = kHeadDim / kPanelCols;
  static constexpr int kQPanelBytes = kWgmmaM * kSwizzleBytes;                 // 8 KiB
  static constexpr int kQBytes = kPanels * kQPanelBytes;                       // one consumer's Q
  static constexpr int kKVPanelBytes = Shape::kBlockCols * kSwizzleBytes;      // 16 or 20 KiB
  static constexpr int kKVBytes = kPanels * kKVPanelBytes;                     // one K or V tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + Shape::kQStages * Shape::kConsumers * kQBytes;
  static constexpr int kV = kK + Shape::kStages * kKVBytes;
  static constexpr int kBarriers = kV + Shape::kStages * kKVBytes;
  // q_full and q_empty for each Q buffer, then k_full, v_full, k_empty, v_empty for each stage: 8
  // bytes each.
  static constexpr int kNumBarriers = 2 * Shape::kQStages + 4 * Shape::kStages;
  static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
  // Dynamic shared memory is only promised 16-byte alignment: ask for one atom more and round up.
  static constexpr size_t kDynamicBytes = static_cast<size_t>(kBytes) + kAtomBytes;
  static_assert(kQPanelBytes % kAtomBytes == 0 && kKVPanelBytes % kAtomBytes == 0, "panels start on atoms");
  static_assert(kHeadDim % kPanelCols == 0, "head_dim is whole panels");
};

// The block's shared memory, carved from the dynamic allocation.
template <typename Element, int kHeadDim, class Shape>
struct Smem {
  using L = SharedLayout<kHeadDim, Shape>;
  unsigned char* base;  // 1024-byte aligned
  __device__ explicit Smem(unsigned char* raw) {
    const uint32_t misalignment = hopper::shared_address(raw) % kAtomBytes;
    base = raw + (misalignment == 0 ? 0 : kAtomBytes - misalignment);
  }
  // The block's q_round-th Q tile goes to Q buffer q_round % kQStages; its barriers complete once
  // per pass over the buffers, so the phase of round r is (r / kQStages) % 2 (as ring_parity).
  // Panel p of consumer c's part of round r's Q tile; of stage s's K and V tiles.
  __device__ unsigned char* q(int r, int c, int p) const {
    return base + L::kQ + ((r % Shape::kQStages) * Shape::kConsumers + c) * L::kQBytes + p * L::kQPanelBytes;
  }
  __device__ unsigned char* k(int s, int p) const { return base + L::kK + s * L::kKVBytes + p * L::kKVPanelBytes; }
  __device__ unsigned char* v(int s, int p) const { return base + L::kV + s * L::kKVBytes + p * L::kKVPanelBytes; }
  __device__ uint64_t* barriers() const { return reinterpret_cast<uint64_t*>(base + L::kBarriers); }
  __device__ uint64_t* q_full(int r) const { return barriers() + r % Shape::kQStages; }
  __device__ uint64_t* q_empty(int r) const { return barriers() + Shape::kQStages + r % Shape::kQStages; }
  __device__ static uint32_t q_parity(int r) { return (r / Shape::kQStages) & 1; }
  static constexpr int kRing = 2 * Shape::kQStages;  // the ring's barriers come after Q's
  __device__ uint64_t* k_full(int s) const { return barriers() + kRing + s; }
  __device__ uint64_t* v_full(int s) const { return barriers() + kRing + Shape::kStages + s; }
  __device__ uint64_t* k_empty(int s) const { return barriers() + kRing + 2 * Shape::kStages + s; }
  __device__ uint64_t* v_empty(int s) const { return barriers() + kRing + 3 * Shape::kStages + s; }
};

// The block's barriers, before any thread uses them: thread 0 initializes them, then the block meets.
// q_empty_arrivals: what releases a Q buffer (the in-order kernel: one arrival per consumer warp; the
// ping-pong kernel: one per consumer warpgroup, store_output_tma's).
template <typename Element, int kHeadDim, class Shape>
__device__ inline void init_barriers(const Smem<Element, kHeadDim, Shape>& sm, uint32_t q_empty_arrivals) {
  if (threadIdx.x == 0) {
    for (int r = 0; r < Shape::kQStages; ++r) {
      hopper::mbarrier_init(sm.q_full(r), 1);  // the producer's arrive.expect_tx; the bytes complete it
      hopper::mbarrier_init(sm.q_empty(r), q_empty_arrivals);
    }
    for (int s = 0; s < Shape::kStages; ++s) {
      hopper::mbarrier_init(sm.k_full(s), 1);
      hopper::mbarrier_init(sm.v_full(s), 1);
      hopper::mbarrier_init(sm.k_empty(s), 4 * Shape::kConsumers);
      hopper::mbarrier_init(sm.v_empty(s), 4 * Shape::kConsumers);
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();
}

// What both kernels know of the problem besides the tensors (hopper.cu makes it).
struct ProblemShape {
  int heads_kv, seq_q, seq_kv;
  float scale_log2;             // softmax scale * log2(e), any sign
  GridDivisor heads_q_divisor;  // batch * heads_q + query head -> batch, query head
  GridDivisor group_divisor;    // query head -> K/V head: the query heads that share one (GQA)
};

// Work tile (bh, q_tile): which rows of which head, and how many K/V tiles they see.
struct WorkTile {
  int bh;  // batch * heads_q + query head
  int first_row, kv_head, num_tiles;
};

template <class Shape, bool kCausal>
__device__ inline WorkTile work_tile(const ProblemShape& problem, int bh, int q_tile) {
  WorkTile t;
  t.bh = bh;
  t.first_row = q_tile * Shape::kBlockRows;
  const int b = divide(bh, problem.heads_q_divisor);
  const int h = remainder(bh, b, problem.heads_q_divisor);
  t.kv_head = b * problem.heads_kv + divide(h, problem.group_divisor);  // flash::kv_head_of
  const int last_row = min(t.first_row + Shape::kBlockRows, problem.seq_q) - 1;
  const int key_end =
      kCausal ? min(problem.seq_kv, flash::causal_key_end(last_row, problem.seq_q, problem.seq_kv)) : problem.seq_kv;
  t.num_tiles = key_end > 0 ? (key_end + Shape::kBlockCols - 1) / Shape::kBlockCols : 0;
  return t;
}

// The warpgroup index, threadIdx.x / 128, as lane 0 has it: the same number, but one that ptxas knows
// is the same in all 32 lanes, and so is what follows from it (a consumer's rows, its first masked
// K/V tile, its K/V loops' bounds and counter). The loops' barrier addresses and wgmma descriptors
// then stay in uniform registers instead of being computed per thread and copied over (R2UR).
__device__ inline int uniform_warpgroup() { return __shfl_sync(kFullWarp, threadIdx.x / kWarpgroupThreads, 0); }

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

// S = Q K^T for one K tile: head_dim / 16 wgmma, the first overwriting S (scale-d false).
template <typename Element, int kHeadDim, class Shape>
__device__ inline void issue_scores(float (&s)[Shape::kBlockCols / 2], const unsigned char* q_panel0,
                                    const unsigned char* k_panel0) {
  using L = SharedLayout<kHeadDim, Shape>;
#pragma unroll
  for (int ks = 0; ks < kHeadDim / kWgmmaK; ++ks)
    hopper::wgmma_ss<Element, Shape::kBlockCols, 1, 0>(s, k_major_descriptor<L::kQPanelBytes>(q_panel0, ks),
                                                       k_major_descriptor<L::kKVPanelBytes>(k_panel0, ks), ks > 0);
}

// O += P V for one V tile: Bc / 16 wgmma with P from registers and V MN-major (imm-trans-b = 1).
template <typename Element, int kHeadDim, class Shape>
__device__ inline void issue_output(float (&o)[kHeadDim / 2], const uint32_t (&p)[Shape::kBlockCols / 16][4],
                                    const unsigned char* v_panel0) {
  using L = SharedLayout<kHeadDim, Shape>;
#pragma unroll
  for (int ks = 0; ks < Shape::kBlockCols / kWgmmaK; ++ks)
    hopper::wgmma_rs<Element, kHeadDim, 1>(o, p[ks], mn_major_descriptor<L::kKVPanelBytes>(v_panel0, ks), true);
}

// TODO(exercise): ring_slot(n), the buffer of the ring's n-th K/V tile (counted over all the
//   block's work tiles), and ring_parity(n), the parity of the phase of that buffer's barriers that
//   the tile's use completes. Each barrier's phase completes once per use of its buffer, and
//   mbarrier_wait(bar, parity) returns once the phase of that parity has completed (on a fresh
//   barrier, parity 1 returns at once: the producer's first wait on an empty buffer). A wrong phase
//   makes a wait return before the copy lands (wrong results) or never (the kernel hangs; the GPU
//   test then fails by its time limit). As shipped every tile uses buffer 0 and phase 0.
//   Checked on the CPU too: ctest -L exercise12 (tests/test_exercise_ideas.cpp).
//   Lesson: stages/12_hopper/README.md, "What changes from stage 10".
template <int kStages>
__device__ inline int ring_slot(int n) {
  return 0 * n;  // placeholder
}
template <int kStages>
__device__ inline uint32_t ring_parity(int n) {
  return 0 * n;  // placeholder
  // END TODO(exercise)
}

// The producer: one thread issues every copy of a work tile: K and V tile by tile through the ring,
// and Q (each consumer's 64 rows, panel by panel, all on q_full) right after the first K tile. For
// each buffer: wait until the consumers have emptied it (on the first pass every buffer is empty:
// parity 1 on a fresh barrier returns at once), announce the tile's bytes on its full barrier, issue
// the copies. K and V have barriers of their own, so that S = Q K^T can start while V is still in
// flight. Q waits for q_empty, the consumers' release of the last work tile's Q; K_0 goes first
// because its buffer is free earlier (kStages K tiles before the end of the last work tile).
// ring: K/V tiles the block's ring carried before this work tile; q_round: Q tiles it loaded before.
template <typename Element, int kHeadDim, class Shape>
__device__ void produce(const Smem<Element, kHeadDim, Shape>& sm, const CUtensorMap* q_map, const CUtensorMap* k_map,
                        const CUtensorMap* v_map, int first_row, int q_head, int kv_head, int num_tiles, int ring,
                        int q_round) {
  using L = SharedLayout<kHeadDim, Shape>;
  constexpr int kStages = Shape::kStages;
  for (int j = 0; j < num_tiles; ++j) {
    const int s = ring_slot<kStages>(ring + j);
    const uint32_t empty_parity = ring_parity<kStages>(ring + j) ^ 1;
    const int first_key = j * Shape::kBlockCols;
    mbarrier_wait(sm.k_empty(s), empty_parity);
    // TODO(exercise): the transaction count of the K tile's full barrier: the bytes the copies below
    //   land in the buffer (every panel of the tile; SharedLayout says how many). The phase completes
    //   when that many bytes have arrived, so any other count hangs the consumers or releases them
    //   early. The same for V below.
    //   Lesson: stages/12_hopper/README.md, "What changes from stage 10".
    mbarrier_arrive_expect_tx(sm.k_full(s), L::kKVPanelBytes);  // placeholder
    // END TODO(exercise)
#pragma unroll
    for (int p = 0; p < L::kPanels; ++p) tma_load_3d(sm.k(s, p), k_map, sm.k_full(s), p * kPanelCols, first_key, kv_head);
    if (j == 0) {
      mbarrier_wait(sm.q_empty(q_round), sm.q_parity(q_round) ^ 1);
      mbarrier_arrive_expect_tx(sm.q_full(q_round), Shape::kConsumers * L::kQBytes);
#pragma unroll
      for (int c = 0; c < Shape::kConsumers; ++c)
#pragma unroll
        for (int p = 0; p < L::kPanels; ++p)
          tma_load_3d(sm.q(q_round, c, p), q_map, sm.q_full(q_round), p * kPanelCols, first_row + c * kWgmmaM,
                      q_head);
    }
    mbarrier_wait(sm.v_empty(s), empty_parity);
    // TODO(exercise): the transaction count of the V tile's full barrier.
    //   Lesson: stages/12_hopper/README.md, "What changes from stage 10".
    mbarrier_arrive_expect_tx(sm.v_full(s), L::kKVPanelBytes);  // placeholder
    // END TODO(exercise)
#pragma unroll
    for (int p = 0; p < L::kPanels; ++p) tma_load_3d(sm.v(s, p), v_map, sm.v_full(s), p * kPanelCols, first_key, kv_head);
  }
}

// The producer thread's whole run: every work tile the scheduler gives the block, in order. The
// consumers walk the same work tiles and count the same K/V tiles (ring) and Q tiles (q_round), so
// their barrier phases agree without talking. A work tile that sees no key loads nothing.
template <typename Element, int kHeadDim, bool kCausal, class Shape>
__device__ void produce_all(const Smem<Element, kHeadDim, Shape>& sm, const TileScheduler& scheduler,
                            const ProblemShape& problem, const CUtensorMap* q_map, const CUtensorMap* k_map,
                            const CUtensorMap* v_map) {
  int ring = 0, q_round = 0;
  for (int step = 0; step < scheduler.num_steps; ++step) {
    int bh, q_tile;
    if (!scheduler.tile_of_step(step, bh, q_tile)) continue;
    const WorkTile t = work_tile<Shape, kCausal>(problem, bh, q_tile);
    if (t.num_tiles == 0) continue;
    produce<Element, kHeadDim, Shape>(sm, q_map, k_map, v_map, t.first_row, t.bh, t.kv_head, t.num_tiles, ring,
                                      q_round);
    ring += t.num_tiles;
    ++q_round;
  }
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
template <typename Element, int kHeadDim, class Shape>
__device__ void negate_q_tile(const Smem<Element, kHeadDim, Shape>& sm, int q_round, int consumer, int thread) {
  using L = SharedLayout<kHeadDim, Shape>;
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

// The online softmax of one tile for this thread's two rows (row0 and row0 + 8), stage 10's: base 2,
// the scale inside the exp2's FFMA, read from the scores s (Q was negated for a negative scale)
// without writing them: the probabilities 2^(s * scale_log2 - max2) go straight into p, wgmma's
// register A operand for O += P V, one fragment per 16 keys. row_max2 and row_sum move on; rescale[h]
// is what row h's output accumulators must be multiplied by. t = lane % 4: this thread holds columns
// 8i + 2t and 8i + 2t + 1 of every 8-column block i; S's blocks 2ks and 2ks + 1 are P's fragment ks
// (hopper.cuh's table):
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

// The two instances of softmax_tile, as arguments to the consumers' lambdas.
using Masked = std::true_type;
using Unmasked = std::false_type;

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

}  // namespace stage12

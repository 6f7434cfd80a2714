// What stage 14's main kernel is made of: the tile shape, the shared-memory layout and its barriers,
// the wgmma descriptors, the producer's copies, and the five products of one step. backward_kernel.cuh
// puts them together; hopper_backward.cu launches it between the two small kernels of steps.cuh.
//
// The block owns one K/V tile of Bc = 128 keys. Each of its two consumer warpgroups owns 64 of those
// keys, and works with the transposes of the forward's matrices, so that the key is always the M of
// its wgmma (the 64 rows a warpgroup's accumulators hold):
//   S^T  = K Q^T           64 keys x Br queries   A = K (registers, then shared), B = Q (shared, K-major)
//   dP^T = V dO^T          64 keys x Br queries   A = V (shared), B = dO (shared, K-major)
//   P^T  = exp2(S^T * scale log2 e - lse log2 e),  dS^T = P^T o (dP^T - D)      (registers)
//   dV  += P^T dO          64 keys x d            A = P^T (registers), B = dO (shared, MN-major)
//   dK  += dS^T Q          64 keys x d            A = dS^T (registers), B = Q (shared, MN-major)
//   dQ_share = dS K        64 x 64                A = dS (shared, written by both warpgroups), B = K
// P^T and dS^T never leave the registers for dV and dK: the accumulator fragment of S^T is the A
// fragment of P^T, as S's is P's in the forward (hopper.cuh's table). Only dS goes to shared memory,
// because dQ needs it with the query as M.
#pragma once

#include <type_traits>

#include "flash_stage.cuh"
#include "hopper.cuh"
#include "tensor_core.cuh"

namespace stage14 {

using hopper::advance_descriptor;
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
using tensor_core::kLog2e;
using tensor_core::pack2;

constexpr int kWarpgroupThreads = 128;  // 4 warps: the unit that issues a wgmma
constexpr int kWgmmaM = 64;             // the M of wgmma.m64nNk16: one warpgroup's keys
constexpr int kWgmmaK = 16;             // its K, for 16-bit inputs
constexpr int kElementBytes = 2;        // fp16, bf16
constexpr int kSwizzleBytes = 128;      // CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunks swizzled within 128 bytes
constexpr int kPanelCols = kSwizzleBytes / kElementBytes;  // 64 elements: the widest box row the swizzle allows
constexpr int kAtomBytes = 8 * kSwizzleBytes;  // 1024: 8 rows of 128 bytes, where the swizzle pattern repeats
constexpr int kKStepBytes = kWgmmaK * kElementBytes;  // 32: how far one k-step moves along a K-major row
constexpr int kConsumers = 2;                          // consumer warpgroups, 64 keys each
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;  // the consumers, then the producer
constexpr int kBlockCols = kConsumers * kWgmmaM;                // Bc: 128 keys per block
constexpr int kStages = 2;  // Q/dO buffers: the next query tile loads while this one is computed
constexpr int kConsumerThreads = kConsumers * kWarpgroupThreads;
// Named barriers (ids; 0 is __syncthreads'). dS written: both consumer warpgroups, after each wrote its
// half of dS^T, before either reads all of it for dQ. dQ staged and dQ free, a pair per consumer
// warpgroup: the warpgroup and the dQ warp (a warp of the producer warpgroup), around the
// warpgroup's part of the staging buffer: the warpgroup arrives when its share is in it and waits
// until the copy engine has read the last one out; the dQ warp the other way round.
// Stage free (one per Q/dO stage): the consumers, after their last read of a stage's buffers, and
// the load warp, before it loads the stage again: a named barrier rather than an mbarrier, because
// the consumers read the stage's lse and D with ordinary loads, and compute-sanitizer's racecheck
// orders those before the next copy into them through a named barrier (bar.arrive, bar.sync) but not
// through an mbarrier's arrive and wait.
constexpr int kDsWrittenBarrier = 1;
constexpr int kDqStagedBarrier = 2;  // and 6: one per consumer warpgroup
constexpr int kDqFreeBarrier = 3;    // and 7
constexpr int kStageFreeBarrier = 4;  // and 5
constexpr int kConsumersAndWarp = kConsumerThreads + 32;  // the consumers and the dQ or the load warp
constexpr int kWarpgroupAndWarp = kWarpgroupThreads + 32;  // one consumer warpgroup and the dQ warp

// The query rows per step (Br) at each head_dim, from the register budget of a consumer thread (240,
// setmaxnreg): dK and dV take d / 2 floats each, S^T and dP^T Br / 2 each, dQ's share 32, K's
// fragments 16 (kKeyFragments):
//   head_dim 128, Br = 64:  64 + 64 + 32 + 32 + 32 + 16 = 240
//   head_dim 64,  Br = 128: 32 + 32 + 64 + 64 + 32 + 16 = 240
// (the dQ share is not live at the same time as all of S^T and dP^T, so the peak is lower). The
// shared memory (SharedLayout) fits with two Q/dO stages and two dS buffers either way: 198696 and
// 199720 bytes of the H100's 232448 per block, alignment slack included.
// dQ's share is 64 x 64 per warpgroup: at head_dim 128, Br = 64 queries by half of head_dim each (the
// warpgroup's panel of K); at head_dim 64, half of the 128 queries each by all of head_dim.
// head_dim 32 runs on head_dim 64's tiles, as FlashAttention-3 runs every head_dim up to 64 (its
// round_up_headdim): the tensor maps know the tensors' 32 columns, so the copy engine fills the other
// 32 of each 64-column box row with zeros. S^T and dP^T come out the same; dV, dK and dQ come out
// with 32 zero columns, which are not written. It costs twice the products a kernel of 32 columns
// would do, and adds no kernel code.
template <int kTensorHeadDim_>
struct BackwardTiles {
  static constexpr int kTensorHeadDim = kTensorHeadDim_;  // the columns of q, k, v, d_o and the gradients
  static constexpr int kHeadDim = kTensorHeadDim < kPanelCols ? kPanelCols : kTensorHeadDim;  // the tiles'
  static constexpr int kBlockRows = kHeadDim == 64 ? 128 : 64;  // Br
  static constexpr int kPanels = kHeadDim / kPanelCols;         // 64-column panels of Q, K, V, dO
  static constexpr int kDsPanels = kBlockRows / kPanelCols;     // 64-query panels of dS^T
  // K's first k-steps (16 columns of head_dim each) held in registers for the whole block, as S^T's
  // A operand: S^T's wgmma then reads only Q from shared memory for them. 16 registers: all of K's
  // 64 columns at head_dim 64, half of them at 128 (ptxas serializes the wgmma with more, C7512).
  static constexpr int kKeyFragments = 4;
  // The step's lse read into registers before its products are issued (load_lse2), rather than
  // pair by pair as P^T needs it: a load issued after the products waits behind their wgmma
  // instructions in each warp's queue to shared memory. At Br = 64 the 16 registers fit beside K's
  // fragments (ptxas spills one other register); the 32 of Br = 128 spill.
  static constexpr bool kLseAhead = kBlockRows == 64;
  // dV waited for before dQ's share and dK are issued. At Br = 64, with dV still running beside them,
  // its A operand and its 64 accumulators, dK's and the share's are more than ptxas keeps in flight:
  // it serializes every wgmma of the kernel (C7512). At Br = 128 they fit, and the same wait made
  // ptxas spill and the kernel slower (docs/experiments/stage14.md).
  static constexpr bool kDvBeforeDq = kBlockRows == 64;
  // The warpgroup's share of dQ: which dS^T panel it reads (its A) and which K panel (its B).
  __device__ static int dq_ds_panel(int consumer) { return kDsPanels == 1 ? 0 : consumer; }
  __device__ static int dq_k_panel(int consumer) { return kPanels == 1 ? 0 : consumer; }
  static_assert(kTensorHeadDim == 32 || kHeadDim == kTensorHeadDim, "head_dim 32 alone runs on wider tiles");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 32, 64 or 128");
  static_assert(kBlockRows * kHeadDim == kConsumers * kWgmmaM * kWgmmaM, "dQ: one 64 x 64 share per warpgroup");
};

// Where everything lives in the block's dynamic shared memory. Tiles are stored as 64-column panels
// of 128-byte rows in the 128-byte swizzle (the layout the copy engine writes and wgmma reads), each
// panel starting on a 1024-byte boundary.
template <class Tiles>
struct SharedLayout {
  static constexpr int kKVPanelBytes = kBlockCols * kSwizzleBytes;          // 16 KiB
  static constexpr int kKVBytes = Tiles::kPanels * kKVPanelBytes;          // one K or V tile
  static constexpr int kQPanelBytes = Tiles::kBlockRows * kSwizzleBytes;   // 8 or 16 KiB
  static constexpr int kQBytes = Tiles::kPanels * kQPanelBytes;            // one Q or dO tile
  static constexpr int kDsPanelBytes = kBlockCols * kSwizzleBytes;         // dS^T: 128 keys x 64 queries
  static constexpr int kDqFloats = Tiles::kBlockRows * Tiles::kHeadDim;    // the block's share of dQ
  static constexpr int kRowBytes = Tiles::kBlockRows * 4;                  // a tile's lse or D
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKVBytes;
  static constexpr int kQ = kV + kKVBytes;
  static constexpr int kDO = kQ + kStages * kQBytes;
  static constexpr int kDs = kDO + kStages * kQBytes;
  // dS^T in two buffers, by step parity: a warpgroup may write step n + 1's while the other still
  // reads step n's for dQ (they meet once per step, at kDsWrittenBarrier).
  static constexpr int kDsBytes = Tiles::kDsPanels * kDsPanelBytes;
  static constexpr int kDq = kDs + 2 * kDsBytes;
  static constexpr int kLse = kDq + kDqFloats * 4;
  static constexpr int kD = kLse + kStages * kRowBytes;
  static constexpr int kBarriers = kD + kStages * kRowBytes;
  // kv_full, then q_full and do_full per stage: 8 bytes each.
  static constexpr int kNumBarriers = 1 + 2 * kStages;
  static constexpr int kBytes = kBarriers + 8 * kNumBarriers;
  // Dynamic shared memory is only promised 16-byte alignment: ask for one atom more and round up.
  static constexpr size_t kDynamicBytes = static_cast<size_t>(kBytes) + kAtomBytes;
  static_assert(kQPanelBytes % kAtomBytes == 0 && kDq % kAtomBytes == 0, "panels start on atoms");
};

template <typename Element, class Tiles>
struct Smem {
  using L = SharedLayout<Tiles>;
  unsigned char* base;  // 1024-byte aligned
  __device__ explicit Smem(unsigned char* raw) {
    const uint32_t misalignment = hopper::shared_address(raw) % kAtomBytes;
    base = raw + (misalignment == 0 ? 0 : kAtomBytes - misalignment);
  }
  __device__ unsigned char* k(int p) const { return base + L::kK + p * L::kKVPanelBytes; }
  __device__ unsigned char* v(int p) const { return base + L::kV + p * L::kKVPanelBytes; }
  __device__ unsigned char* q(int s, int p) const { return base + L::kQ + s * L::kQBytes + p * L::kQPanelBytes; }
  __device__ unsigned char* d_o(int s, int p) const {
    return base + L::kDO + s * L::kQBytes + p * L::kQPanelBytes;
  }
  __device__ unsigned char* ds(int n, int p) const {
    return base + L::kDs + (n % 2) * L::kDsBytes + p * L::kDsPanelBytes;
  }
  __device__ float* dq() const { return reinterpret_cast<float*>(base + L::kDq); }
  __device__ float* lse2(int s) const { return reinterpret_cast<float*>(base + L::kLse + s * L::kRowBytes); }
  __device__ float* d(int s) const { return reinterpret_cast<float*>(base + L::kD + s * L::kRowBytes); }
  __device__ uint64_t* barriers() const { return reinterpret_cast<uint64_t*>(base + L::kBarriers); }
  __device__ uint64_t* kv_full() const { return barriers(); }
  __device__ uint64_t* q_full(int s) const { return barriers() + 1 + s; }
  __device__ uint64_t* do_full(int s) const { return barriers() + 1 + kStages + s; }
};

// The n-th step of the block (a query tile of one query head) uses Q/dO buffer n % kStages; its
// barriers complete once per pass over the buffers, so the phase is (n / kStages) % 2.
__device__ inline int stage_of(int n) { return n % kStages; }
__device__ inline uint32_t parity_of(int n) { return (n / kStages) & 1; }

// What the block's threads know of the problem besides the tensors.
struct ProblemShape {
  int batch, heads_q, heads_kv, seq_q, seq_kv;
  int padded_seq_q;   // seq_q rounded up to 128: the rows of the workspace's per-row arrays
  float scale_log2;   // softmax scale * log2(e), any sign
  float scale;        // dS's factor in dK and dQ
  int wave_kv_heads;  // K/V heads to a wave of blocks (block_work): about one block per SM in all
};

// The block's work: K/V tile `key_tile` of K/V head `kv_bh` (batch * heads_kv + head), against every
// query head of its group and, per head, every query tile from first_q_tile on (causal: the earlier
// tiles see none of the block's keys).
struct BlockWork {
  int kv_bh, key_tile, num_key_tiles, first_key, first_q_tile, num_q_tiles, group;
  int first_q_bh;  // batch * heads_q + the group's first query head
  __device__ int steps() const { return group * (num_q_tiles - first_q_tile); }
  // Step n's query head and query tile.
  __device__ void step(int n, int& q_bh, int& q_tile) const {
    const int per_head = num_q_tiles - first_q_tile;
    q_bh = first_q_bh + n / per_head;
    q_tile = first_q_tile + n % per_head;
  }
};

// The blocks come in waves of K/V heads, as many heads as make about one block per SM, so that the
// ones running at the same time read the Q and dO tiles of a few heads and add into their dQ tiles,
// which then stay in the L2 cache. Inside a wave, in key-tile order across its heads: with the causal
// mask the first key tiles are seen by the most query tiles, so the longest blocks of every head in
// the wave start first (as stage 10's longest-first order, seen from the keys), and the wave's last
// blocks are short. The deterministic mode with the mask reverses that order (dq_add_rank says why).
template <class Tiles, bool kCausal, bool kDeterministic>
__device__ inline BlockWork block_work(const ProblemShape& p) {
  BlockWork w;
  w.num_key_tiles = (p.seq_kv + kBlockCols - 1) / kBlockCols;
  const int wave_blocks = p.wave_kv_heads * w.num_key_tiles;
  const int first_kv_bh = blockIdx.x / wave_blocks * p.wave_kv_heads;
  const int heads_in_wave = min(p.wave_kv_heads, p.batch * p.heads_kv - first_kv_bh);  // fewer in the last
  const int in_wave = blockIdx.x % wave_blocks;
  w.kv_bh = first_kv_bh + in_wave % heads_in_wave;
  const int position = in_wave / heads_in_wave;
  w.key_tile = kCausal && kDeterministic ? w.num_key_tiles - 1 - position : position;
  w.first_key = w.key_tile * kBlockCols;
  w.group = p.heads_q / p.heads_kv;
  const int b = w.kv_bh / p.heads_kv, kv_head = w.kv_bh % p.heads_kv;
  w.first_q_bh = b * p.heads_q + kv_head * w.group;
  w.num_q_tiles = (p.seq_q + Tiles::kBlockRows - 1) / Tiles::kBlockRows;
  // Causal (bottom-right): query row r sees keys up to r + seq_kv - seq_q, so the block's first key
  // is first seen by row first_key - (seq_kv - seq_q). Every key is seen by the last row.
  const int first_row = kCausal ? max(0, w.first_key - (p.seq_kv - p.seq_q)) : 0;
  w.first_q_tile = first_row / Tiles::kBlockRows;
  return w;
}

// The deterministic mode: the place of this block's add among the adds into query tile q_tile's dQ
// accumulator, a fixed order for the problem's shape. Every block waits for the blocks before it, so
// the order is the one in which the blocks reach the tile when they run at one pace, and the blocks
// waited for have lower block indices (started first, so never waiting for this one):
//   not causal: every block takes the query tiles in order, the key tiles in block order: rank = the
//     key tile;
//   causal: block kt starts at its first visible query tile, which is later for later key tiles, so
//     a later key tile reaches a given query tile earlier: the blocks run in reverse key-tile order
//     (block_work), and the rank is (the last key tile that the query tile sees) - kt.
template <class Tiles, bool kCausal>
__device__ inline int dq_add_rank(const BlockWork& w, const ProblemShape& p, int q_tile) {
  if constexpr (!kCausal) return w.key_tile;
  const int last_row = q_tile * Tiles::kBlockRows + Tiles::kBlockRows - 1;
  const int last_key_tile = min(w.num_key_tiles - 1, (last_row + p.seq_kv - p.seq_q) / kBlockCols);
  return last_key_tile - w.key_tile;
}

// Whether step (q_tile) needs the mask: causal, when its first row does not see the block's last key;
// and the block's last tile of keys when it reaches past seq_kv (those keys are zeros from the copy
// engine, but their P = exp2(-lse log2 e) could overflow: they are set to 0).
template <class Tiles, bool kCausal>
__device__ inline bool needs_mask(const ProblemShape& p, int first_key, int q_tile) {
  const int last_key = first_key + kBlockCols - 1;
  const bool past_end = last_key >= p.seq_kv;
  if (!kCausal) return past_end;
  return past_end || last_key > q_tile * Tiles::kBlockRows + p.seq_kv - p.seq_q;
}

// Descriptors (hopper.cuh explains the fields). K-major operands (head_dim contiguous: K and V as
// the A of S^T and dP^T, Q and dO as their B): one k-step of 16 elements is 32 bytes along a 128-byte
// row, a k-step in the second panel starts in that panel; SBO = 1024, LBO unused ("assumed 1").
constexpr uint32_t kKMajorLbo = 16;
constexpr uint32_t kSbo = kAtomBytes;

template <int kPanelBytes>
__device__ inline uint64_t k_major_descriptor(const unsigned char* panel0, int ks) {
  constexpr int kStepsPerPanel = kSwizzleBytes / kKStepBytes;  // 4
  return advance_descriptor(matrix_descriptor(panel0, kKMajorLbo, kSbo),
                            (ks / kStepsPerPanel) * kPanelBytes + (ks % kStepsPerPanel) * kKStepBytes);
}

// MN-major operands (the M or N dimension contiguous, the k dimension along the rows: Q and dO as
// the B of dK and dV, whose k is the query; K as the B of dQ and dS^T as its A, whose k is the key):
// one k-step is 16 rows = 2048 bytes down the panel; LBO is the distance from one 64-column panel
// of N to the next, SBO from one group of 8 rows to the next (1024).
template <int kPanelBytes>
__device__ inline uint64_t mn_major_descriptor(const unsigned char* panel0, int ks) {
  return advance_descriptor(matrix_descriptor(panel0, kPanelBytes, kSbo), ks * kWgmmaK * kSwizzleBytes);
}

// The block's barriers, before any thread uses them.
template <typename Element, class Tiles>
__device__ inline void init_barriers(const Smem<Element, Tiles>& sm) {
  if (threadIdx.x == 0) {
    hopper::mbarrier_init(sm.kv_full(), 1);  // the producer's arrive.expect_tx; the bytes complete it
    for (int s = 0; s < kStages; ++s) {
      hopper::mbarrier_init(sm.q_full(s), 1);
      hopper::mbarrier_init(sm.do_full(s), 1);
    }
    hopper::fence_barrier_init();
  }
  __syncthreads();
}

// The stage-free barrier of stage s: the consumers arrive (after step n's last read of the stage),
// the load warp waits (before step n + kStages's copies into it). The ids are immediates (hopper.cuh
// says why), hence the branch.
__device__ inline void stage_free_arrive(int s) {
  if (s == 0)
    hopper::named_barrier_arrive<kStageFreeBarrier + 0, kConsumersAndWarp>();
  else
    hopper::named_barrier_arrive<kStageFreeBarrier + 1, kConsumersAndWarp>();
}
__device__ inline void stage_free_wait(int s) {
  if (s == 0)
    hopper::named_barrier_sync<kStageFreeBarrier + 0, kConsumersAndWarp>();
  else
    hopper::named_barrier_sync<kStageFreeBarrier + 1, kConsumersAndWarp>();
}
static_assert(kStages == 2, "one stage-free barrier per stage");

// The dQ staging barriers of consumer warpgroup c, between it and the dQ warp: kBarrier
// (kDqStagedBarrier or kDqFreeBarrier) for warpgroup 0, kBarrier + 4 for warpgroup 1, so that neither
// waits for the other's share to be staged or read. The ids are immediates, hence the branch.
template <int kBarrier>
__device__ inline void dq_barrier_arrive(int c) {
  if (c == 0)
    hopper::named_barrier_arrive<kBarrier, kWarpgroupAndWarp>();
  else
    hopper::named_barrier_arrive<kBarrier + 4, kWarpgroupAndWarp>();
}
template <int kBarrier>
__device__ inline void dq_barrier_wait(int c) {
  if (c == 0)
    hopper::named_barrier_sync<kBarrier, kWarpgroupAndWarp>();
  else
    hopper::named_barrier_sync<kBarrier + 4, kWarpgroupAndWarp>();
}
static_assert(kConsumers == 2, "one pair of dQ staging barriers per consumer warpgroup");

// The producer: the load warp, whose lane 0 issues every copy. K and V once; then per step, into
// buffer n % kStages once the consumers have freed it (the first kStages steps find their buffers
// empty), Q with its rows' lse on q_full and dO with their D on do_full, so that S^T = K Q^T can start
// while dO is still in flight. lse2 and d: the workspace's per-row arrays (padded_seq_q rows per query
// head, see steps.cuh).
template <typename Element, class Tiles>
__device__ void produce(const Smem<Element, Tiles>& sm, const BlockWork& w, const ProblemShape& problem,
                        const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                        const CUtensorMap* do_map, const float* lse2, const float* d) {
  using L = SharedLayout<Tiles>;
  const bool issuer = threadIdx.x % 32 == 0;
  if (issuer) {
    mbarrier_arrive_expect_tx(sm.kv_full(), 2 * L::kKVBytes);
#pragma unroll
    for (int p = 0; p < Tiles::kPanels; ++p) {
      tma_load_3d(sm.k(p), k_map, sm.kv_full(), p * kPanelCols, w.first_key, w.kv_bh);
      tma_load_3d(sm.v(p), v_map, sm.kv_full(), p * kPanelCols, w.first_key, w.kv_bh);
    }
  }
  const int steps = w.steps();
  for (int n = 0; n < steps; ++n) {
    int q_bh, q_tile;
    w.step(n, q_bh, q_tile);
    const int s = stage_of(n);
    const int first_row = q_tile * Tiles::kBlockRows;
    const long long row_offset = static_cast<long long>(q_bh) * problem.padded_seq_q + first_row;
    __syncwarp();  // bar.sync is .aligned: the whole warp executes it together
    if (n >= kStages) stage_free_wait(s);
    if (!issuer) continue;
    mbarrier_arrive_expect_tx(sm.q_full(s), L::kQBytes + L::kRowBytes);
#pragma unroll
    for (int p = 0; p < Tiles::kPanels; ++p)
      tma_load_3d(sm.q(s, p), q_map, sm.q_full(s), p * kPanelCols, first_row, q_bh);
    hopper::bulk_load(sm.lse2(s), lse2 + row_offset, L::kRowBytes, sm.q_full(s));
    mbarrier_arrive_expect_tx(sm.do_full(s), L::kQBytes + L::kRowBytes);
#pragma unroll
    for (int p = 0; p < Tiles::kPanels; ++p)
      tma_load_3d(sm.d_o(s, p), do_map, sm.do_full(s), p * kPanelCols, first_row, q_bh);
    hopper::bulk_load(sm.d(s), d + row_offset, L::kRowBytes, sm.do_full(s));
  }
}

// X^T = A B^T for the warpgroup's 64 keys: A is K or V (rows consumer * 64 on, K-major), B is Q or dO
// (K-major), d / 16 wgmma, the first overwriting the accumulators.
template <typename Element, class Tiles>
__device__ inline void issue_transposed_scores(float (&acc)[Tiles::kBlockRows / 2], const unsigned char* keys_panel0,
                                               const unsigned char* queries_panel0, int consumer) {
  using L = SharedLayout<Tiles>;
  const unsigned char* own_keys = keys_panel0 + consumer * kWgmmaM * kSwizzleBytes;
#pragma unroll
  for (int ks = 0; ks < Tiles::kHeadDim / kWgmmaK; ++ks)
    hopper::wgmma_ss<Element, Tiles::kBlockRows, 1, 0>(acc, k_major_descriptor<L::kKVPanelBytes>(own_keys, ks),
                                                        k_major_descriptor<L::kQPanelBytes>(queries_panel0, ks),
                                                        ks > 0);
}

// S^T = K Q^T for the warpgroup's 64 keys: its first kFragments k-steps with A = K from registers
// (load_key_fragments), the rest as issue_transposed_scores, both operands from shared memory.
template <typename Element, class Tiles, int kFragments>
__device__ inline void issue_scores(float (&acc)[Tiles::kBlockRows / 2], const uint32_t (&k_frag)[kFragments][4],
                                    const unsigned char* keys_panel0, const unsigned char* queries_panel0,
                                    int consumer) {
  using L = SharedLayout<Tiles>;
  const unsigned char* own_keys = keys_panel0 + consumer * kWgmmaM * kSwizzleBytes;
#pragma unroll
  for (int ks = 0; ks < kFragments; ++ks)
    hopper::wgmma_rs<Element, Tiles::kBlockRows, 0>(acc, k_frag[ks],
                                                     k_major_descriptor<L::kQPanelBytes>(queries_panel0, ks), ks > 0);
#pragma unroll
  for (int ks = kFragments; ks < Tiles::kHeadDim / kWgmmaK; ++ks)
    hopper::wgmma_ss<Element, Tiles::kBlockRows, 1, 0>(acc, k_major_descriptor<L::kKVPanelBytes>(own_keys, ks),
                                                        k_major_descriptor<L::kQPanelBytes>(queries_panel0, ks), true);
}

// acc (64 keys x d) += X^T Y for the warpgroup's keys: X^T (P^T or dS^T) from registers, one fragment
// per 16 queries; Y (dO or Q) MN-major.
template <typename Element, class Tiles>
__device__ inline void issue_key_gradient(float (&acc)[Tiles::kHeadDim / 2],
                                          const uint32_t (&x)[Tiles::kBlockRows / 16][4],
                                          const unsigned char* y_panel0) {
  using L = SharedLayout<Tiles>;
#pragma unroll
  for (int ks = 0; ks < Tiles::kBlockRows / kWgmmaK; ++ks)
    hopper::wgmma_rs<Element, Tiles::kHeadDim, 1>(acc, x[ks], mn_major_descriptor<L::kQPanelBytes>(y_panel0, ks),
                                                   true);
}

// The warpgroup's 64 x 64 share of the block's dQ = dS K (BackwardTiles says which): A = dS, read
// from dS^T's panel (MN-major, imm-trans-a = 1), B = the K panel (MN-major), k = all 128 keys of
// both warpgroups.
template <typename Element, class Tiles>
__device__ inline void issue_dq_share(float (&acc)[kWgmmaM / 2], const Smem<Element, Tiles>& sm, int n, int consumer) {
  using L = SharedLayout<Tiles>;
  const unsigned char* ds_panel = sm.ds(n, Tiles::dq_ds_panel(consumer));
  const unsigned char* k_panel = sm.k(Tiles::dq_k_panel(consumer));
#pragma unroll
  for (int ks = 0; ks < kBlockCols / kWgmmaK; ++ks)
    hopper::wgmma_ss<Element, kWgmmaM, 1, 1, 1>(acc, mn_major_descriptor<L::kDsPanelBytes>(ds_panel, ks),
                                                 mn_major_descriptor<L::kKVPanelBytes>(k_panel, ks), ks > 0);
}

// The two instances of the step, as arguments to the kernel's lambda.
using Masked = std::true_type;
using Unmasked = std::false_type;

// Where this thread's accumulator elements of a 64-key x N tile lie: with g = lane / 4, t = lane % 4
// and warp w of the warpgroup, element 4i + 2h + e is key row 16w + g + 8h, column 8i + 2t + e.
struct FragmentPlace {
  int key0;  // the key of h = 0, relative to the block's first key
  int t;
  __device__ FragmentPlace(int consumer, int thread_in_warpgroup) {
    const int warp = thread_in_warpgroup / 32, lane = thread_in_warpgroup % 32;
    key0 = consumer * kWgmmaM + 16 * warp + lane / 4;
    t = lane % 4;
  }
};

// The first kFrags k-steps (16 columns of head_dim each) of the warpgroup's 64 keys of K as wgmma A
// fragments, read once from the K tile, whose 64-column panels of 128 rows are in the 128-byte swizzle
// (16-byte chunk c of row r at chunk c ^ (r % 8), the layout ds_byte_offset spells out for dS^T):
// fragment word 2 half + h is key row key0 + 8h, columns 16 ks + 8 half + 2t, + 1 (hopper.cuh's table).
template <class Tiles, int kFrags>
__device__ inline void load_key_fragments(uint32_t (&a)[kFrags][4], const unsigned char* k_panel0,
                                          const FragmentPlace& at) {
  using L = SharedLayout<Tiles>;
#pragma unroll
  for (int ks = 0; ks < kFrags; ++ks)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = at.key0 + 8 * h;
        const int col = 16 * ks + 8 * half + 2 * at.t;
        const int panel = col / kPanelCols, chunk = (col % kPanelCols) / 8;
        a[ks][2 * half + h] = *reinterpret_cast<const uint32_t*>(
            k_panel0 + panel * L::kKVPanelBytes + row * kSwizzleBytes + ((chunk ^ (row % 8)) * 16) + (col % 8) * kElementBytes);
      }
}

// The step's base-2 lse of this thread's columns, the pairs of queries 8i + 2t, + 1, from the stage's
// lse array.
template <class Tiles>
__device__ inline void load_lse2(float2 (&lse2)[Tiles::kBlockRows / 8], const float* lse2_shared,
                                 const FragmentPlace& at) {
#pragma unroll
  for (int i = 0; i < Tiles::kBlockRows / 8; ++i)
    lse2[i] = *reinterpret_cast<const float2*>(lse2_shared + 8 * i + 2 * at.t);
}

// P^T = exp2(S^T * scale log2 e - lse log2 e) in place, in fp32, with lse2_pair(i) the base-2 lse of
// the columns (queries) 8i + 2t, + 1: a row of the forward that saw no key has lse2 = +inf there
// (steps.cuh), so its P is 0. Masked: keys past a query's last visible key, or past seq_kv, get 0.
template <class Tiles, bool kCausal, bool kMasked, class Lse2Pair>
__device__ inline void probabilities(float (&s)[Tiles::kBlockRows / 2], const Lse2Pair& lse2_pair,
                                     const FragmentPlace& at, int first_key, int first_row,
                                     const ProblemShape& problem) {
#pragma unroll
  for (int i = 0; i < Tiles::kBlockRows / 8; ++i) {
    const float2 l = lse2_pair(i);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * i + 2 * h + e];
        x = exp2_approx(fmaf(x, problem.scale_log2, -(e == 0 ? l.x : l.y)));
        if constexpr (kMasked) {
          const int key = first_key + at.key0 + 8 * h;
          const int query = first_row + 8 * i + 2 * at.t + e;
          const int key_end =
              kCausal ? min(problem.seq_kv, flash::causal_key_end(query, problem.seq_q, problem.seq_kv))
                      : problem.seq_kv;
          if (key >= key_end) x = 0.0f;
        }
      }
  }
}

// dS^T = P^T o (dP^T - D) in place in dp, with D of each column (query).
template <class Tiles>
__device__ inline void score_gradients(float (&dp)[Tiles::kBlockRows / 2], const float (&p)[Tiles::kBlockRows / 2],
                                       const float* d, const FragmentPlace& at) {
#pragma unroll
  for (int i = 0; i < Tiles::kBlockRows / 8; ++i) {
    const float2 dd = *reinterpret_cast<const float2*>(d + 8 * i + 2 * at.t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      dp[4 * i + 2 * h] = p[4 * i + 2 * h] * (dp[4 * i + 2 * h] - dd.x);
      dp[4 * i + 2 * h + 1] = p[4 * i + 2 * h + 1] * (dp[4 * i + 2 * h + 1] - dd.y);
    }
  }
}

// An accumulator tile rounded to Element as wgmma's register A operand, one fragment per 16 columns:
// columns 16ks .. 16ks + 15 are the accumulator's 8-column blocks 2ks and 2ks + 1 (hopper.cuh's table).
template <typename Element, int kCols>
__device__ inline void to_a_fragments(const float (&acc)[kCols / 2], uint32_t (&a)[kCols / 16][4]) {
#pragma unroll
  for (int ks = 0; ks < kCols / 16; ++ks)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 2 * ks + half;
        a[ks][2 * half + h] = pack2<Element>(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
      }
}

// Where dS^T[key row][query] lies in a dS buffer, in bytes: 64-query panels of 128 key rows, each row
// 128 bytes (64 queries), in the 128-byte swizzle: the 16-byte chunk c of row r (queries 8c .. 8c + 7
// of the panel) at chunk c ^ (r % 8). This is the layout wgmma reads as an MN-major operand whose M
// (the query) is contiguous, so that dQ's wgmma reads dS = (dS^T)^T as its A, with imm-trans-a = 1.
__host__ __device__ constexpr int ds_byte_offset(int key_row, int query) {
  constexpr int kChunkBytes = 16;
  constexpr int kPanelBytes = kBlockCols * kSwizzleBytes;
  const int panel = query / kPanelCols, chunk = (query % kPanelCols) / 8;
  return panel * kPanelBytes + key_row * kSwizzleBytes + ((chunk ^ (key_row % 8)) * kChunkBytes) +
         (query % 8) * kElementBytes;
}

// dS^T into shared memory for dQ (ds_byte_offset's layout). The 32-bit word of (key row, queries
// 8i + 2t, + 1) is fragment word ds[i / 2][2 (i % 2) + h]; a warp's 32 stores hit 32 different banks
// (8 rows, each its own chunk, 4 words each).
template <typename Element, class Tiles>
__device__ inline void store_ds(const Smem<Element, Tiles>& sm, int n, const uint32_t (&ds)[Tiles::kBlockRows / 16][4],
                                const FragmentPlace& at) {
  unsigned char* buffer = sm.ds(n, 0);
#pragma unroll
  for (int i = 0; i < Tiles::kBlockRows / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<uint32_t*>(buffer + ds_byte_offset(at.key0 + 8 * h, 8 * i + 2 * at.t)) =
          ds[i / 2][2 * (i % 2) + h];
}

// The layout of the block's dQ share in shared memory, and so in the workspace's fp32 accumulator
// (steps.cuh reads it back): warpgroup c's 64 x 64 share at float c * 4096, in which thread th's
// accumulators 4j .. 4j + 3 are the float4 at 512 j + 4 th. Each warp's 16-byte stores then fill 512
// contiguous bytes: no bank conflicts, and one bulk reduction adds the whole share to global memory.
constexpr int kDqShareFloats = kWgmmaM * kWgmmaM;  // 4096
__device__ __host__ inline int dq_share_offset(int consumer, int j, int thread_in_warpgroup) {
  return consumer * kDqShareFloats + j * 4 * kWarpgroupThreads + 4 * thread_in_warpgroup;
}

}  // namespace stage14

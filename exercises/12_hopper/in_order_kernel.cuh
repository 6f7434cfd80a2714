// Stage 12's kernel for head_dim 64 without the mask: one consumer warpgroup, in order, a block per
// work tile. It is stage 10's loop on Hopper's instructions:
// - the matrix products are wgmma.mma_async: one instruction per 64 x N x 16 product for a whole
//   warpgroup (4 warps, 128 threads), its operands read by the tensor cores straight from shared
//   memory through matrix descriptors (no ldmatrix), asynchronous: issued, committed, waited for.
//   S = Q K^T takes both operands from shared memory; O += P V takes P from registers (the same
//   accumulator-to-operand conversion as stages 08-10) and V from shared memory, "transposed"
//   (MN-major: V's rows are keys, its contiguous dimension is N = head_dim);
// - Q, K and V reach shared memory through the tensor memory accelerator (cp.async.bulk.tensor):
//   one thread issues a copy of a whole tile, described by a tensor map made on the host, and the
//   copy engine writes it already swizzled (128-byte swizzle, the layout wgmma reads) and reports
//   the bytes to an mbarrier. Rows past the end of the sequence are filled with zeros by the engine;
// - warp specialization: a producer warp issues every copy; the consumer warpgroup computes. They
//   talk only through mbarriers: for each of the two K and V buffers a "full" barrier (the producer's
//   expected bytes, completed by the copy engine) and an "empty" barrier (one arrival per consumer
//   warp when its wgmma have finished reading the buffer).
// The softmax is stage 10's (mainloop.cuh, softmax_tile); the output leaves as stage 10's does
// (epilogue.cuh, store_output).
//
// Why this kernel at head_dim 64 without the mask, and not the ping-pong kernel: it was measured
// faster there at every sequence length, and far behind it with the mask or at head_dim 128 (see
// docs/experiments/stage12.md). The likely reason, not profiled: up to three of its blocks share an
// SM, and their softmaxes and work-tile boundaries fall at different times, where the ping-pong
// kernel's two consumers meet every boundary together.
#pragma once

#include "epilogue.cuh"
#include "mainloop.cuh"
#include "tile_scheduler.cuh"

namespace stage12 {

// One consumer warpgroup (64 query rows), 128 keys a K/V tile, one Q buffer; a producer warp.
using InOrderTiles = TileShape<1, 128, 1>;
constexpr int kInOrderHeadDim = 64;
constexpr int kInOrderThreads = kWarpgroupThreads * InOrderTiles::kConsumers + 32;

// The consumer loop: per K/V tile, S = Q K^T, wait; softmax; O += P V, wait. The tensor cores idle
// while the softmax runs, unless another block on the SM has products in flight.
template <typename Element, int kHeadDim, bool kCausal, class Shape>
__device__ void consume_in_order(const Smem<Element, kHeadDim, Shape>& sm, const ConsumerWork& w,
                                 float (&o)[kHeadDim / 2], float (&row_max2)[2], float (&row_sum)[2]) {
  constexpr int kBlockCols = Shape::kBlockCols;
  constexpr int kStages = Shape::kStages;
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
    issue_scores<Element, kHeadDim, Shape>(s, sm.q(w.q_round, w.consumer, 0), sm.k(st, 0));
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
    issue_output<Element, kHeadDim, Shape>(o, p, sm.v(st, 0));
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
  // Every product that reads Q has finished.
  release(sm.q_empty(w.q_round), lane);
}

// One block per work unit (block_per_tile_schedule): a work tile of 64 query rows of one head,
// numbered as stage 10's grid. q_map, k_map, v_map: 3-D tensor maps (head_dim, sequence,
// batch * heads) over q, k, v with boxes of (64, 64 or 128, 1), 128-byte swizzle (hopper.cu makes
// them). The K/V head of query head h is an index into k_map and v_map (GQA).
template <typename Element>
__global__ void __launch_bounds__(kInOrderThreads, 1)
    in_order_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                    const __grid_constant__ CUtensorMap v_map, Element* o, float* lse, ProblemShape problem,
                    TileSchedule schedule) {
#if FLASH_HOPPER_SM90A
  constexpr int kHeadDim = kInOrderHeadDim;
  constexpr bool kCausal = false;
  using Shape = InOrderTiles;
  static_assert(sizeof(Element) == kElementBytes, "16-bit elements");
  extern __shared__ unsigned char shared_raw[];
  const Smem<Element, kHeadDim, Shape> sm(shared_raw);
  // One arrival per consumer warp releases Q (consume_in_order).
  init_barriers(sm, 4 * Shape::kConsumers);

  const TileScheduler scheduler(schedule);
  const int warpgroup = uniform_warpgroup();
  if (warpgroup == Shape::kConsumers) {
    // The producer warp: one thread issues the copies.
    if (threadIdx.x % kWarpgroupThreads != 0) return;
    produce_all<Element, kHeadDim, kCausal, Shape>(sm, scheduler, problem, &q_map, &k_map, &v_map);
  } else {
    int ring = 0, q_round = 0;
    for (int step = 0; step < scheduler.num_steps; ++step) {
      int bh, q_tile;
      if (!scheduler.tile_of_step(step, bh, q_tile)) continue;
      const WorkTile t = work_tile<Shape, kCausal>(problem, bh, q_tile);
      ConsumerWork w;
      w.consumer = warpgroup;
      w.first_row = t.first_row + warpgroup * kWgmmaM;
      w.num_tiles = t.num_tiles;
      w.ring = ring;
      w.q_round = q_round;
      w.seq_q = problem.seq_q;
      w.seq_kv = problem.seq_kv;
      w.scale_log2 = problem.scale_log2;
      float acc_o[kHeadDim / 2] = {};
      // Base-2 statistics of this thread's two rows: row_max2 = max of s * scale_log2, row_sum =
      // this thread's share of sum 2^(s2 - row_max2), summed over the row's 4 threads at the end.
      float row_max2[2] = {-INFINITY, -INFINITY};
      float row_sum[2] = {0.0f, 0.0f};
      if (t.num_tiles > 0) {
        consume_in_order<Element, kHeadDim, kCausal, Shape>(sm, w, acc_o, row_max2, row_sum);
        ring += t.num_tiles;
        ++q_round;
      }
      float* lse_head = lse ? lse + static_cast<long long>(t.bh) * problem.seq_q : nullptr;
      const int lane = threadIdx.x % 32;
      const int row0 = w.first_row + 16 * ((threadIdx.x % kWarpgroupThreads) / 32) + lane / 4;
      Element* o_head = o + static_cast<long long>(t.bh) * problem.seq_q * kHeadDim;
      store_output<Element, kHeadDim>(o_head, lse_head, acc_o, row_max2, row_sum, row0, problem.seq_q, lane % 4);
    }
  }
#else
  // Compiled for another target: never launched (stage12::check_gpu refuses first).
  (void)q_map, (void)k_map, (void)v_map, (void)o, (void)lse, (void)problem, (void)schedule;
#endif
}

}  // namespace stage12

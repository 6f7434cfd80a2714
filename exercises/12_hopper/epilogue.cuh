// Stage 12's output: O normalized by each row's sum and rounded to the element type, and lse. The
// in-order kernel stores each thread's fragments to global memory (store_output, stage 10's store);
// the ping-pong kernel writes its O tile into shared memory and hands it to the copy engine
// (round_output, then store_output_tma).
#pragma once

#include "mainloop.cuh"

namespace stage12 {

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

// O normalized and rounded to Element, as store_output_tma writes it: words[h][i] holds this
// thread's two adjacent elements of 8-column block i of its row h; sum[h] is the row's sum over its
// 4 threads. (Ordinary instructions define these registers: the ping-pong kernel keeps them while
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

// The output through shared memory. The warpgroup writes its O tile (round_output) into its own Q
// buffer, which no product reads any more, in the layout the copy engine loaded Q in: 64-column
// panels of 128-byte rows, the 16-byte chunk c of row r at chunk c ^ (r % 8) (the 128-byte swizzle).
// Each warp store is then free of bank conflicts: its 8 rows put their chunks in 8 different places
// of the 128-byte line. After a proxy fence and the warpgroup's barrier, one thread issues the TMA
// store of each panel; the copy engine skips the rows past seq_q (outside the tensor map) and writes
// whole 128-byte lines, where the per-thread stores of store_output write 16 bytes of each of 8 rows
// per instruction. lse is written as in store_output. The thread does not wait for the engine here:
// it reads while the warpgroup starts its next work tile, and the kernel waits and releases Q's
// buffer during that work tile (the ping-pong kernel's release_stored_q), as a block must also do
// before it exits.
template <typename Element, int kHeadDim, class Shape>
__device__ inline void store_output_tma(const Smem<Element, kHeadDim, Shape>& sm, const CUtensorMap* o_map,
                                        int q_round, int consumer, int first_row, int bh, float* lse_head,
                                        const RoundedOutput<kHeadDim>& out, int seq_q) {
  using L = SharedLayout<kHeadDim, Shape>;
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
  }
}

}  // namespace stage12

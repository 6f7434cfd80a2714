// Stage 14's first and last steps, around the main kernel (backward_kernel.cuh):
//   1. prepare_kernel: per query row, D = rowsum(dO o O) and the lse in base 2 (lse * log2 e; +inf
//      for a row that saw no key, so that exp2(s - lse2) = 0 there; 0 for the padding rows past
//      seq_q), into arrays of padded_seq_q rows per query head that the producer copies in whole
//      query tiles; and the fp32 dQ accumulator and the deterministic mode's counters zeroed.
//   3. convert_dq_kernel: dQ = scale * accumulator, rounded to the element type, each element put
//      back in its place from the layout the main kernel's warpgroups stage it in (dq_share_offset).
#pragma once

#include "mainloop.cuh"

namespace stage14 {

constexpr int kVecElems = 8;  // 16-bit elements per 16-byte vector

// One row per kHeadDim / 8 threads: each loads 8 elements of dO and of O (16 bytes each), and the
// row's lanes sum their products by shuffles. The same threads zero the accumulator (rows x the
// tiles' head_dim floats, BackwardTiles: 8 floats a thread, 16 at head_dim 32), and the first ones the
// counters.
template <typename Element, int kHeadDim>
__global__ void prepare_kernel(const Element* d_o, const Element* o, const float* lse, float* lse2, float* d,
                               float* dq_accum, int* dq_counters, long long num_counters, int seq_q, int padded_seq_q,
                               long long padded_rows) {
  constexpr int kLanesPerRow = kHeadDim / kVecElems;
  constexpr int kAccumCols = BackwardTiles<kHeadDim>::kHeadDim;
  constexpr int kZeroFloat4s = kAccumCols / kLanesPerRow / 4;
  const long long thread = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long padded_row = thread / kLanesPerRow;
  const int c = static_cast<int>(thread % kLanesPerRow) * kVecElems;
  const long long head = padded_row / padded_seq_q;
  const int row = static_cast<int>(padded_row % padded_seq_q);
  const bool real = padded_row < padded_rows && row < seq_q;
  float sum = 0.0f;
  if (real) {  // no early return: every lane takes part in the shuffles below
    const long long at = (head * seq_q + row) * kHeadDim + c;
    const uint4 a = *reinterpret_cast<const uint4*>(d_o + at);
    const uint4 b = *reinterpret_cast<const uint4*>(o + at);
    const Element* x = reinterpret_cast<const Element*>(&a);
    const Element* y = reinterpret_cast<const Element*>(&b);
#pragma unroll
    for (int i = 0; i < kVecElems; ++i) sum = fmaf(static_cast<float>(x[i]), static_cast<float>(y[i]), sum);
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(tensor_core::kFullWarp, sum, offset);
  if (padded_row < padded_rows) {
    if (c == 0) {
      float l2 = 0.0f;
      if (real) {
        const float l = lse[head * seq_q + row];
        l2 = l == -INFINITY ? INFINITY : l * kLog2e;
      }
      lse2[padded_row] = l2;
      d[padded_row] = sum;
    }
    float4* zero = reinterpret_cast<float4*>(dq_accum + padded_row * kAccumCols + c * (kAccumCols / kHeadDim));
#pragma unroll
    for (int z = 0; z < kZeroFloat4s; ++z) zero[z] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (thread < num_counters) dq_counters[thread] = 0;
}

// One thread per float4 of the accumulator, which holds warpgroup c's accumulators 4j .. 4j + 3 of
// thread th (dq_share_offset): 8-column block j of its rows g and g + 8 (g = lane / 4, warp w, rows
// 16w + g in the warpgroup's share), columns 8j + 2t, + 1 (t = lane % 4). The share is rows 0-63 x
// columns 64c on at head_dim 128 (Br = 64), rows 64c on x all 64 columns at head_dim 64 (Br = 128)
// and 32 (whose zero columns 32-63 are not written).
template <typename Element, int kHeadDim>
__global__ void convert_dq_kernel(const float* dq_accum, Element* dq, long long float4s, int seq_q,
                                  int padded_seq_q, float scale) {
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kBlockRows = Tiles::kBlockRows;
  constexpr int kTileFloats = kBlockRows * Tiles::kHeadDim;
  const long long index = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= float4s) return;
  const float4 x = reinterpret_cast<const float4*>(dq_accum)[index];
  const long long f = index * 4;
  const long long tile = f / kTileFloats;  // q_bh * (padded_seq_q / Br) + q_tile
  const int in_tile = static_cast<int>(f % kTileFloats);
  const int consumer = in_tile / kDqShareFloats;
  const int j = (in_tile % kDqShareFloats) / (4 * kWarpgroupThreads);
  const int th = (in_tile % (4 * kWarpgroupThreads)) / 4;
  const int warp = th / 32, lane = th % 32;
  const int share_row = 16 * warp + lane / 4;
  const int col = 8 * j + 2 * (lane % 4);
  const int tiles_per_head = padded_seq_q / kBlockRows;
  const long long q_bh = tile / tiles_per_head;
  const int first_row = static_cast<int>(tile % tiles_per_head) * kBlockRows;
  const int row = first_row + (Tiles::kHeadDim == 128 ? share_row : consumer * kWgmmaM + share_row);
  const int dim = Tiles::kHeadDim == 128 ? consumer * kWgmmaM + col : col;
  if (dim >= kHeadDim) return;
  const float pair[2][2] = {{x.x, x.y}, {x.z, x.w}};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (row + 8 * h >= seq_q) continue;
    Element* out = dq + (q_bh * seq_q + row + 8 * h) * kHeadDim + dim;
    *reinterpret_cast<uint32_t*>(out) = pack2<Element>(pair[h][0] * scale, pair[h][1] * scale);
  }
}

}  // namespace stage14

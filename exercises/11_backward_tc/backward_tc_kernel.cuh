// Stage 11's kernels, templates over their tile shapes so that backward_tc.cu can pick one shape per
// head_dim (and a benchmark can time others).
//
// The backward of lesson 07 on the tensor cores. With S = scale * Q K^T, P = softmax(S) and O = P V:
//   D = rowsum(dO o O),  dV = P^T dO,  dP = dO V^T,  dS = P o (dP - D),  dK = scale * dS^T Q,  dQ = scale * dS K.
// Four kernels, in stream order:
//   1. row_dot_kernel: D (fp32) for every query row; in the default mode it also zeros the fp32 dQ
//      accumulator in the workspace.
//   2. dk_dv_kernel, one block per K/V tile (Bc keys) of one K/V head: K_j and V_j stay in shared memory,
//      dK_j and dV_j in registers, while the block streams every query tile that can see the keys (of
//      every query head of the GQA group, so dK and dV of a group are summed in registers, in a fixed
//      order, with no atomics). Per query tile the warps compute
//        S = Q K^T,  P = exp2(S * scale log2 e - lse log2 e),  dP = dO V^T,  dS = P o (dP - D)
//      in Br/2 x 32 warp tiles (FlashAttention-2's two-dimensional warp grid: each warp reads a part of
//      each operand per k-step, not the whole query tile), write P and dS to shared memory, and after a
//      barrier read them back, transposed, as the A operands of
//        dV += P^T dO,  dK += dS^T Q     (32 keys x d/2 dims per warp)
//      and, in the default mode, as stored for the block's share of dQ, dS K, added into the fp32
//      accumulator: on Hopper, each warp stages its part in shared memory and one bulk copy adds it
//      (cp.reduce.async.bulk); elsewhere, or where shared memory has no room for the staging, each
//      lane adds its accumulators with red.global.add.
//   3a. default mode, convert_dq_kernel: dQ = scale * accumulator, rounded to the dtype, its rows put
//      back in order (the accumulator is laid out as the warps hold dQ's shares: DqShare).
//   3b. deterministic mode, dq_kernel: no atomics. dk_dv_kernel leaves dQ alone and this kernel,
//      one block per query tile, streams the K/V tiles the way the forward does and recomputes
//      S, P, dP and dS to sum dQ_i = scale * sum_j dS_ij K_j in registers in key order (stage 07's
//      second pass): every dQ element has one writer and one summation order.
// All accumulation is fp32; mma operands are fp16 or bf16, and P and dS are rounded to it on their
// way into the mma, as in FlashAttention-2.
#pragma once

#include "flash_stage.cuh"
#include "tensor_core.cuh"

namespace stage11 {

// The shape of dk_dv_kernel: kWarps warps, Bc = 16 * kWarps keys per block, and Br = kBlockRows query
// rows per step of the loop over query tiles (the kernel's warp grids are written for 8 warps, Bc = 128,
// and Br a multiple of 32).
template <int kWarps_, int kBlockRows_, int kMinBlocksPerSm_>
struct KeyTileConfig {
  static constexpr int kWarps = kWarps_;
  static constexpr int kBlockCols = 16 * kWarps_;  // Bc: keys per block
  static constexpr int kBlockRows = kBlockRows_;   // Br: query rows per step
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;  // __launch_bounds__: caps registers per thread
};

// The shape of dq_kernel (deterministic mode): kWarps warps of 16 query rows each (Br = 16 * kWarps
// rows per block), streaming K/V tiles of kBlockCols keys.
template <int kWarps_, int kBlockCols_, int kMinBlocksPerSm_>
struct QueryTileConfig {
  static constexpr int kWarps = kWarps_;
  static constexpr int kBlockRows = 16 * kWarps_;  // Br: query rows per block, one m-tile per warp
  static constexpr int kBlockCols = kBlockCols_;   // Bc: keys per K/V tile
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
};

// How dk_dv_kernel adds a step's share of dQ into the fp32 accumulator (the default mode), or that it
// does not (deterministic mode, where dq_kernel computes dQ).
enum class DqMode {
  kSecondPass,  // deterministic: dk_dv_kernel leaves dQ to dq_kernel
  kRedAdd,      // each lane adds its accumulators, red.global.add from registers
  kBulkAdd,     // each warp stages its part in shared memory, one cp.reduce.async.bulk adds it (sm_90)
};

namespace kernel_detail {

using tensor_core::bulk_commit;
using tensor_core::bulk_reduce_add_f32;
using tensor_core::bulk_wait;
using tensor_core::bulk_wait_read;
using tensor_core::cp_async_16;
using tensor_core::cp_async_commit;
using tensor_core::cp_async_wait;
using tensor_core::exp2_approx;
using tensor_core::fence_proxy_async_shared;
using tensor_core::kFullWarp;
using tensor_core::kLog2e;
using tensor_core::ldmatrix_x4;
using tensor_core::ldmatrix_x4_trans;
using tensor_core::mma_m16n8k16;
using tensor_core::pack2;
using tensor_core::red_add_f32x2;
using tensor_core::unpack2;

constexpr int kMmaM = 16;     // the M of mma.m16n8k16
constexpr int kMmaN = 8;      // the N
constexpr int kMmaK = 16;     // the K
constexpr int kVecElems = 8;  // 16-byte vectors of 16-bit elements
constexpr int kStages = 2;    // double buffers: one being computed on, one in flight

// The base-2 lse a row's probabilities are recomputed from: P = 2^(s * scale log2 e - lse2). A row
// that saw no key (lse = -inf) and a padding row past seq_q get +inf, so every P of theirs is
// 2^(-inf) = 0 whatever its score: they add nothing to any gradient.
__device__ inline float lse_base2(const float* lse, long long index, bool real) {
  if (!real) return INFINITY;
  const float l = lse[index];
  return l == -INFINITY ? INFINITY : l * kLog2e;
}

// Stage 09's XOR swizzle for a tile kWidth elements wide: 16-byte chunk c of row r is stored at
// chunk c ^ (r % 8) (pairs or quads of rows share a pattern when a row holds fewer than 8 chunks).
// ldmatrix reads 8 rows of one chunk column, which the swizzle spreads over all 32 banks.
template <int kWidth>
__device__ inline int swizzled(int row, int col) {
  constexpr int kChunksPerRow = kWidth / kVecElems;
  static_assert(kWidth % kVecElems == 0 && kChunksPerRow >= 1, "rows of whole 16-byte chunks");
  constexpr int kRowsPerWindow = kChunksPerRow >= 8 ? 1 : 8 / kChunksPerRow;  // rows per 128 bytes
  constexpr int kPatterns = kChunksPerRow >= 8 ? 8 : kChunksPerRow;
  const int chunk = (col / kVecElems) ^ ((row / kRowsPerWindow) % kPatterns);
  return chunk * kVecElems + col % kVecElems;
}

// Starts copying rows [first, first + kRows) of a [num_rows, kWidth] matrix into a swizzled shared
// tile, zeros past num_rows; the caller commits and waits. A trip count known at compile time, so
// the loop unrolls into straight-line cp.async (stage 10).
template <int kRows, int kWidth, int kThreads, typename Element>
__device__ void load_rows_async(Element (*tile)[kWidth], const Element* src, int first, int num_rows) {
  constexpr int kVecsPerRow = kWidth / kVecElems;
  constexpr int kVecs = kRows * kVecsPerRow;
  constexpr int kPasses = (kVecs + kThreads - 1) / kThreads;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int index = pass * kThreads + static_cast<int>(threadIdx.x);
    if (kVecs % kThreads != 0 && index >= kVecs) break;
    const int r = index / kVecsPerRow;
    const int c = (index % kVecsPerRow) * kVecElems;
    const bool valid = first + r < num_rows;
    const Element* from = valid ? src + static_cast<long long>(first + r) * kWidth + c : src;
    cp_async_16(&tile[r][swizzled<kWidth>(r, c)], from, valid);
  }
}

// acc[nb] (nb over kNBlocks blocks of 8 columns) += A * B^T for one warp, where A is the 16 rows of
// a_tile from a_row (the mma's M) and B the kNBlocks * 8 rows of b_tile (the mma's N), both stored
// [row][kDim] and swizzled: the k-loop runs over the kDim columns both share. S = Q K^T and
// dP = dO V^T in dq_kernel (dk_dv_kernel's warp tiles are warp_tile_abt's).
template <int kNBlocks, int kDim, typename Element>
__device__ void warp_gemm_abt(float (&acc)[kNBlocks][4], Element (*a_tile)[kDim], int a_row,
                              Element (*b_tile)[kDim], int lane) {
  static_assert(kNBlocks % 2 == 0, "B operands are loaded two n-blocks at a time (ldmatrix.x4)");
  static_assert(kDim % kMmaK == 0, "whole k-steps");
#pragma unroll
  for (int ks = 0; ks < kDim / kMmaK; ++ks) {
    uint32_t a[4];
    const int ra = a_row + lane % 16;
    ldmatrix_x4(a, &a_tile[ra][swizzled<kDim>(ra, ks * kMmaK + (lane / 16) * 8)]);
#pragma unroll
    for (int nb = 0; nb < kNBlocks; nb += 2) {
      uint32_t b[4];
      const int rb = nb * kMmaN + (lane / 16) * 8 + lane % 8;
      ldmatrix_x4(b, &b_tile[rb][swizzled<kDim>(rb, ks * kMmaK + ((lane / 8) % 2) * 8)]);
      mma_m16n8k16<Element>(acc[nb], a, b[0], b[1]);
      mma_m16n8k16<Element>(acc[nb + 1], a, b[2], b[3]);
    }
  }
}

// acc[db] += A * B for one warp, where A (16 x kK) is in registers as fp32 accumulators of a
// previous mma (a_acc[kb], kb over kK / 8 blocks of 8 columns: the layout of warp_gemm_abt's acc),
// rounded to Element on the way, and B (kK x kNBlocks * 8 columns from b_col) is stored [k][n] in
// b_tile, read transposed by ldmatrix. dQ += dS K in dq_kernel (dk_dv_kernel's products from shared
// memory are warp_tile_ab's). The accumulator's columns 2t, 2t + 1 of n-blocks 2 ks and 2 ks + 1 are
// exactly the A operand's k = 2t, 2t + 1 and 2t + 8, 2t + 9 of k-step ks: no data moves between lanes.
template <int kK, int kNBlocks, int kWidth, typename Element>
__device__ void warp_gemm_acc_b(float (&acc)[kNBlocks][4], const float (&a_acc)[kK / kMmaN][4],
                                Element (*b_tile)[kWidth], int b_col, int lane) {
  static_assert(kK % kMmaK == 0, "whole k-steps");
  static_assert(kNBlocks % 2 == 0, "B operands are loaded two n-blocks at a time (ldmatrix.x4.trans)");
#pragma unroll
  for (int ks = 0; ks < kK / kMmaK; ++ks) {
    uint32_t a[4];
    a[0] = pack2<Element>(a_acc[2 * ks][0], a_acc[2 * ks][1]);
    a[1] = pack2<Element>(a_acc[2 * ks][2], a_acc[2 * ks][3]);
    a[2] = pack2<Element>(a_acc[2 * ks + 1][0], a_acc[2 * ks + 1][1]);
    a[3] = pack2<Element>(a_acc[2 * ks + 1][2], a_acc[2 * ks + 1][3]);
#pragma unroll
    for (int nb = 0; nb < kNBlocks; nb += 2) {
      uint32_t b[4];
      const int r = ks * kMmaK + ((lane / 8) % 2) * 8 + lane % 8;
      ldmatrix_x4_trans(b, &b_tile[r][swizzled<kWidth>(r, b_col + nb * kMmaN + (lane / 16) * 8)]);
      mma_m16n8k16<Element>(acc[nb], a, b[0], b[1]);
      mma_m16n8k16<Element>(acc[nb + 1], a, b[2], b[3]);
    }
  }
}

// acc[m][nb] += A_m B^T for a warp tile of kMTiles m-tiles (16 rows each, from a_row of a_tile) by
// kNBlocks n-blocks (8 rows each of b_tile, from b_row), both stored [row][kDim] and swizzled. Each
// k-step loads every A and B fragment once: a tile of 32 x 32 reads 64 rows per k-step for 32 x 32
// outputs, where warp_gemm_abt's 16 x 64 reads 80 (S = Q K^T and dP = dO V^T in dk_dv_kernel).
template <int kMTiles, int kNBlocks, int kDim, typename Element>
__device__ void warp_tile_abt(float (&acc)[kMTiles][kNBlocks][4], Element (*a_tile)[kDim], int a_row,
                              Element (*b_tile)[kDim], int b_row, int lane) {
  static_assert(kNBlocks % 2 == 0, "B operands are loaded two n-blocks at a time (ldmatrix.x4)");
#pragma unroll
  for (int ks = 0; ks < kDim / kMmaK; ++ks) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      const int ra = a_row + m * kMmaM + lane % 16;
      ldmatrix_x4(a[m], &a_tile[ra][swizzled<kDim>(ra, ks * kMmaK + (lane / 16) * 8)]);
    }
#pragma unroll
    for (int nb = 0; nb < kNBlocks; nb += 2) {
      uint32_t b[4];
      const int rb = b_row + nb * kMmaN + (lane / 16) * 8 + lane % 8;
      ldmatrix_x4(b, &b_tile[rb][swizzled<kDim>(rb, ks * kMmaK + ((lane / 8) % 2) * 8)]);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        mma_m16n8k16<Element>(acc[m][nb], a[m], b[0], b[1]);
        mma_m16n8k16<Element>(acc[m][nb + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// acc[m][nb] += A_m B for a warp tile, both operands from shared memory: A (kMTiles m-tiles from
// row a_row, k over kK) stored [row][k] (ldmatrix) or, kATransposed, [k][row] (ldmatrix.trans); B
// (k over kK, kNBlocks n-blocks from column b_col) stored [k][n] (ldmatrix.trans). dV += P^T dO and
// dK += dS^T Q read P and dS, stored [query][key], transposed; dQ += dS K reads dS as stored.
template <int kMTiles, int kNBlocks, int kK, bool kATransposed, int kAWidth, int kBWidth, typename Element>
__device__ void warp_tile_ab(float (&acc)[kMTiles][kNBlocks][4], Element (*a_tile)[kAWidth], int a_row,
                             Element (*b_tile)[kBWidth], int b_col, int lane) {
  static_assert(kNBlocks % 2 == 0, "B operands are loaded two n-blocks at a time (ldmatrix.x4.trans)");
#pragma unroll
  for (int ks = 0; ks < kK / kMmaK; ++ks) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      if constexpr (kATransposed) {
        // Matrices 0-3: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
        const int rk = ks * kMmaK + (lane / 16) * 8 + lane % 8;
        ldmatrix_x4_trans(a[m], &a_tile[rk][swizzled<kAWidth>(rk, a_row + m * kMmaM + ((lane / 8) % 2) * 8)]);
      } else {
        const int ra = a_row + m * kMmaM + lane % 16;
        ldmatrix_x4(a[m], &a_tile[ra][swizzled<kAWidth>(ra, ks * kMmaK + (lane / 16) * 8)]);
      }
    }
#pragma unroll
    for (int nb = 0; nb < kNBlocks; nb += 2) {
      uint32_t b[4];
      const int rb = ks * kMmaK + ((lane / 8) % 2) * 8 + lane % 8;
      ldmatrix_x4_trans(b, &b_tile[rb][swizzled<kBWidth>(rb, b_col + nb * kMmaN + (lane / 16) * 8)]);
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        mma_m16n8k16<Element>(acc[m][nb], a[m], b[0], b[1]);
        mma_m16n8k16<Element>(acc[m][nb + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// A step's share of dQ in dk_dv_kernel, dS K_j [Br x d], and where it goes in the fp32 accumulator.
// The warps split it kWarpRows x kWarpCols: 4 columns of warps unless the share is narrower than it is
// tall (d < Br) or too narrow for 4 (d = 32), then 2, so that each warp's tile is as near square as the
// grid allows (the fewest operand rows read per output).
// The accumulator is not laid out row by row but as the warps hold the share: query tile qt of query
// head bh takes Br x d floats from (bh * num_q_tiles + qt) * Br * d, warp w's part kWarpFloats of
// them from there, and in it lane l's accumulator acc[m][nb][0..3] is float4 number
// (m * kNBlocks + nb) * 32 + l. Each warp then adds one contiguous block: one bulk copy from shared
// memory written without bank conflicts, or red.global.add instructions. For one fragment (m, nb) the
// warp's 32 float4 are 512 contiguous bytes; lane l adds its first pair, then its second, so one
// red.global.add.v2.f32 (sm_90) covers 8 bytes of every 16, 256 bytes in all, and the pair of them
// the whole 512 (below sm_90, four scalar red.global.add.f32 of 4 bytes per lane). Rows past seq_q
// in a head's last tile have room there, and get zeros (their P is 0).
// convert_dq_kernel, which reads the accumulator once anyway, puts the rows back in order.
template <int kHeadDim, class Config>
struct DqShare {
  static constexpr int kWarpCols = kHeadDim == 32 || kHeadDim < Config::kBlockRows ? 2 : 4;
  static constexpr int kWarpRows = Config::kWarps / kWarpCols;
  static constexpr int kMTiles = Config::kBlockRows / kMmaM / kWarpRows;  // per warp
  static constexpr int kNBlocks = kHeadDim / kMmaN / kWarpCols;           // per warp
  static constexpr int kWarpFloats = kMTiles * kNBlocks * 4 * 32;        // a warp's part
  static constexpr int kTileFloats = Config::kWarps * kWarpFloats;       // Br x d
  static_assert(kNBlocks % 2 == 0 && kMTiles >= 1, "n-blocks in pairs (ldmatrix.x4)");
  static_assert(kTileFloats == Config::kBlockRows * kHeadDim, "the warps cover the share once");
  // The warp's first row (of the query tile) and first dimension.
  __host__ __device__ static constexpr int first_row(int warp) { return (warp / kWarpCols) * kMTiles * kMmaM; }
  __host__ __device__ static constexpr int first_dim(int warp) { return (warp % kWarpCols) * kNBlocks * kMmaN; }
};

// The shared memory of dk_dv_kernel. K and V for the whole block; Q and dO (with their rows' lse and
// D) double-buffered so that query tile i + 1 is copied while i is computed; P and dS of the step,
// [query][key], written by the warps that compute them and read by the warps that multiply them.
// With DqMode::kBulkAdd the launcher adds DqShare::kTileFloats floats after it: each warp's staging
// buffer for its part of dQ.
template <typename Element, int kHeadDim, class Config>
struct KeyTileShared {
  Element k[Config::kBlockCols][kHeadDim];
  Element v[Config::kBlockCols][kHeadDim];
  Element q[kStages][Config::kBlockRows][kHeadDim];
  Element d_o[kStages][Config::kBlockRows][kHeadDim];
  Element p[Config::kBlockRows][Config::kBlockCols];
  Element ds[Config::kBlockRows][Config::kBlockCols];
  float lse2[kStages][Config::kBlockRows];  // base-2 lse of the tile's rows (+inf: no contribution)
  float d[kStages][Config::kBlockRows];     // D of the tile's rows
};

// The shared memory of dq_kernel: one query tile, double-buffered K/V tiles.
template <typename Element, int kHeadDim, class Config>
struct QueryTileShared {
  Element q[Config::kBlockRows][kHeadDim];
  Element d_o[Config::kBlockRows][kHeadDim];
  Element k[kStages][Config::kBlockCols][kHeadDim];
  Element v[kStages][Config::kBlockCols][kHeadDim];
};

}  // namespace kernel_detail

// 1. D_i = dO_i . O_i in fp32, kHeadDim / 8 lanes per row, each reading 16 bytes of dO and of O; the
// lanes of a row are neighbours in the warp and sum by butterfly. The default mode's accumulator
// (accum_vectors runs of 8 floats, the padding rows of DqShare's layout included) is zeroed by the
// same launch, thread i its i-th run, so that no memset is needed; the launcher covers both counts.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(256)
    row_dot_kernel(const Element* d_o, const Element* o, float* d_rows, long long num_rows, float* dq_accum,
                   long long accum_vectors) {
  using namespace kernel_detail;
  constexpr int kLanesPerRow = kHeadDim / kVecElems;
  static_assert(kLanesPerRow >= 1 && 32 % kLanesPerRow == 0, "a row's lanes within one warp");
  const long long thread = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long row = thread / kLanesPerRow;
  const int c = static_cast<int>(thread % kLanesPerRow) * kVecElems;
  float sum = 0.0f;
  if (row < num_rows) {  // no early return: every lane takes part in the butterfly below
    const uint4 a = *reinterpret_cast<const uint4*>(d_o + row * kHeadDim + c);
    const uint4 b = *reinterpret_cast<const uint4*>(o + row * kHeadDim + c);
    const uint32_t av[4] = {a.x, a.y, a.z, a.w};
    const uint32_t bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = unpack2<Element>(av[i]);
      const float2 y = unpack2<Element>(bv[i]);
      sum = fmaf(x.x, y.x, sum);
      sum = fmaf(x.y, y.y, sum);
    }
  }
  if (thread < accum_vectors) {
    float4* dst = reinterpret_cast<float4*>(dq_accum + thread * kVecElems);
    dst[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    dst[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullWarp, sum, offset);
  if (row < num_rows && c == 0) d_rows[row] = sum;
}

// 2. dK_j, dV_j of one K/V tile of one K/V head, and (unless kDq is kSecondPass) the tile's share of dQ.
// See the top of this file for the products; the comments below follow them step by step.
template <typename Element, int kHeadDim, bool kCausal, DqMode kDq, class Config>
__global__ void __launch_bounds__(Config::kWarps * 32, Config::kMinBlocksPerSm)
    dk_dv_kernel(const Element* q, const Element* k, const Element* v, const Element* d_o, const float* lse,
                 const float* d_rows, float* dq_accum, Element* dk, Element* dv, int heads_q, int heads_kv,
                 int seq_q, int seq_kv, float scale, float scale_log2, int num_k_tiles) {
  using namespace kernel_detail;
  using Shared = KeyTileShared<Element, kHeadDim, Config>;
  constexpr int kThreads = Config::kWarps * 32;
  constexpr int kBlockRows = Config::kBlockRows;  // Br
  constexpr int kBlockCols = Config::kBlockCols;  // Bc
  // The warps tile each product in two dimensions (FlashAttention-2's backward):
  //   S, dP [Br x Bc]: 2 x 4 warps of Br/2 queries x 32 keys;
  //   dV, dK [Bc x d]: 4 x 2 warps of 32 keys x d/2 dims, held in registers for the whole block;
  //   dQ's share [Br x d]: as DqShare says.
  static_assert(Config::kWarps == 8 && kBlockRows % 32 == 0 && kBlockCols == 128,
                "the warp grids below: 8 warps, Br a multiple of 32, Bc = 128");
  constexpr int kScoreMTiles = kBlockRows / 32, kScoreNBlocks = 4;  // Br/2 x 32 of S and dP per warp
  constexpr int kGradMTiles = 2, kGradNBlocks = kHeadDim / 16;      // 32 keys x d/2 of dK and dV per warp
  using Share = DqShare<kHeadDim, Config>;
  static_assert(kGradNBlocks % 2 == 0, "n-blocks in pairs (ldmatrix.x4)");
  static_assert(sizeof(Shared) % 16 == 0 && sizeof(Element) == 2, "16-bit elements, 16-byte rows");
  extern __shared__ uint4 shared_raw[];
  Shared& tile = *reinterpret_cast<Shared*>(shared_raw);
  float* dq_staging = reinterpret_cast<float*>(&tile + 1);  // kBulkAdd: after the tiles (16-byte aligned)

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;            // g: accumulator rows g and g + 8
  const int thread_in_group = lane % 4;  // t: accumulator columns 2t and 2t + 1
  const int score_row = (warp / 4) * (kBlockRows / 2);  // the warp's Br/2 queries of S and dP
  const int score_col = (warp % 4) * 32;  // and its 32 keys
  const int grad_key = (warp % 4) * 32;   // the warp's 32 keys of dK and dV
  const int grad_dim = (warp / 4) * (kHeadDim / 2);  // and its d/2 dims

  // Head by head, causal or not, so that blocks streaming the same Q and dO (and adding into the same
  // rows of the dQ accumulator) run together and share them in L2; within a head, causal, the first
  // tile (seen by every query row: the most work) first.
  const long long kv_head = blockIdx.x / num_k_tiles;
  const int k_tile = static_cast<int>(blockIdx.x % num_k_tiles);
  const int first_key = k_tile * kBlockCols;
  const int heads_per_group = heads_q / heads_kv;
  const long long first_q_head = (kv_head / heads_kv) * heads_q + (kv_head % heads_kv) * heads_per_group;
  const int diagonal = seq_kv - seq_q;  // query i sees keys [0, i + diagonal + 1)

  // The query tiles that see at least one key of the tile: causal, rows from first_key - diagonal on.
  const long long first_row_needed = kCausal ? max(0LL, static_cast<long long>(first_key) - diagonal) : 0LL;
  const int num_q_tiles = (seq_q + kBlockRows - 1) / kBlockRows;
  const int first_q_tile = first_row_needed >= seq_q ? num_q_tiles : static_cast<int>(first_row_needed / kBlockRows);
  const int tiles_per_head = num_q_tiles - first_q_tile;
  const int num_steps = heads_per_group * tiles_per_head;  // (query head of the group, query tile) pairs

  const Element* k_head = k + kv_head * seq_kv * kHeadDim;
  const Element* v_head = v + kv_head * seq_kv * kHeadDim;
  load_rows_async<kBlockCols, kHeadDim, kThreads>(tile.k, k_head, first_key, seq_kv);
  load_rows_async<kBlockCols, kHeadDim, kThreads>(tile.v, v_head, first_key, seq_kv);

  // A step's query tile: rows from first_row of query head `head`. The steps take the tiles of one
  // query head of the group in order, then the next head's, so each step's tile is the one before
  // advanced by one: no division by tiles_per_head in the loop. Not known at compile time, it made
  // each step's division and remainder a sequence of integer instructions (lesson 11: 1.01-1.04x at
  // head_dim 128 without them, and fewer spills).
  struct StepTile {
    long long head;
    int first_row;
  };
  auto next_tile = [&](StepTile t) {
    t.first_row += kBlockRows;
    if (t.first_row >= num_q_tiles * kBlockRows) {
      t.first_row = first_q_tile * kBlockRows;
      ++t.head;
    }
    return t;
  };
  // Starts copying tile t's Q and dO into buffer buf and writes its rows' lse2 and D there.
  auto prefetch = [&](StepTile t, int buf) {
    const long long bh = t.head;
    const int first_row = t.first_row;
    load_rows_async<kBlockRows, kHeadDim, kThreads>(tile.q[buf], q + bh * seq_q * kHeadDim, first_row, seq_q);
    load_rows_async<kBlockRows, kHeadDim, kThreads>(tile.d_o[buf], d_o + bh * seq_q * kHeadDim, first_row, seq_q);
    for (int r = threadIdx.x; r < kBlockRows; r += kThreads) {
      const bool real = first_row + r < seq_q;
      const long long index = bh * seq_q + first_row + r;
      tile.lse2[buf][r] = lse_base2(lse, index, real);
      tile.d[buf][r] = real ? d_rows[index] : 0.0f;
    }
  };
  StepTile current{first_q_head, first_q_tile * kBlockRows};
  if (num_steps > 0) prefetch(current, 0);
  cp_async_commit();  // K, V and the first query tile: one group

  float acc_dk[kGradMTiles][kGradNBlocks][4] = {};
  float acc_dv[kGradMTiles][kGradNBlocks][4] = {};

  for (int step = 0; step < num_steps; ++step) {
    const int buf = step % kStages;
    cp_async_wait<0>();  // this thread's copies of this step (the only group in flight) have landed
    // One barrier per step, plus dS's below. It makes this step's copies, lse2 and D visible, and
    // every warp has left step - 1, so buffer 1 - buf (read in step - 1) may be refilled now, while
    // this step computes.
    __syncthreads();
    const StepTile next = next_tile(current);
    if (step + 1 < num_steps) prefetch(next, 1 - buf);
    cp_async_commit();
    const long long bh = current.head;
    const int first_row = current.first_row;

    // S = Q_i K_j^T, P = 2^(S * scale log2 e - lse2) in place of S, then dP = dO_i V_j^T and
    // dS = P o (dP - D): Br/2 x 32 per warp. P and dS go to shared memory, rounded to Element (the
    // operands of the products below), two keys per 4-byte store. P is computed between the two
    // products, in straight-line code with dP's mma, so that ptxas can issue the exp2 among them rather
    // than leave the tensor cores idle while every warp exponentiates at once. Masked (kMasked), a key
    // past seq_kv or, causal, past the row's diagonal gets P = 0 by a select, not a branch.
    auto scores = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      float s[kScoreMTiles][kScoreNBlocks][4] = {};
      warp_tile_abt<kScoreMTiles, kScoreNBlocks, kHeadDim, Element>(s, tile.q[buf], score_row, tile.k, score_col,
                                                                    lane);
#pragma unroll
      for (int m = 0; m < kScoreMTiles; ++m)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = score_row + m * kMmaM + group + 8 * half;  // query row of the tile
          const float row_lse2 = tile.lse2[buf][row];
          // The row sees the tile's keys [0, visible).
          const int visible = kCausal ? min(seq_kv, first_row + row + diagonal + 1) - first_key : seq_kv - first_key;
#pragma unroll
          for (int nb = 0; nb < kScoreNBlocks; ++nb)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = score_col + nb * kMmaN + 2 * thread_in_group + e;  // key of the tile
              float& x = s[m][nb][2 * half + e];
              x = exp2_approx(fmaf(x, scale_log2, -row_lse2));
              if (kMasked && col >= visible) x = 0.0f;
            }
        }
      float dp[kScoreMTiles][kScoreNBlocks][4] = {};
      warp_tile_abt<kScoreMTiles, kScoreNBlocks, kHeadDim, Element>(dp, tile.d_o[buf], score_row, tile.v, score_col,
                                                                    lane);
#pragma unroll
      for (int m = 0; m < kScoreMTiles; ++m)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = score_row + m * kMmaM + group + 8 * half;
          const float row_d = tile.d[buf][row];
#pragma unroll
          for (int nb = 0; nb < kScoreNBlocks; ++nb) {
            const int col = score_col + nb * kMmaN + 2 * thread_in_group;
            const float* p = &s[m][nb][2 * half];
            // TODO(exercise): dS = P o (dP - D) for the lane's two scores: p[0], p[1] are P, dp[m][nb][2 * half]
            //   and dp[m][nb][2 * half + 1] are dP, row_d is the row's D = rowsum(dO o O).
            //   As shipped P is left out: dK and dQ are wrong (dV is right: it needs no dS).
            //   Lesson: stages/11_backward_tc/README.md, "The math, from lesson 07".
            const float ds0 = dp[m][nb][2 * half] - row_d, ds1 = dp[m][nb][2 * half + 1] - row_d;  // placeholder
            // END TODO(exercise)
            *reinterpret_cast<uint32_t*>(&tile.p[row][swizzled<kBlockCols>(row, col)]) = pack2<Element>(p[0], p[1]);
            *reinterpret_cast<uint32_t*>(&tile.ds[row][swizzled<kBlockCols>(row, col)]) = pack2<Element>(ds0, ds1);
          }
        }
    };
    // Not causal, only the last K/V tile of a seq_kv that is not a multiple of Bc needs the mask: the
    // other steps run a copy without it. Causal, every step runs the masked copy, even a step wholly
    // below the diagonal: one copy of the step's code measured faster there than two (lesson 11).
    if (!kCausal && first_key + kBlockCols <= seq_kv)
      scores(std::false_type{});
    else
      scores(std::true_type{});
    // Every warp's P and dS are in shared memory. No barrier closes the step: the next step writes P
    // and dS only after its first barrier, which every warp reaches after its last read of them here.
    __syncthreads();

    // dV_j += P^T dO_i and dK_j += dS^T Q_i (scaled once, at the end): 32 keys x d/2 per warp.
    warp_tile_ab<kGradMTiles, kGradNBlocks, kBlockRows, true, kBlockCols, kHeadDim, Element>(
        acc_dv, tile.p, grad_key, tile.d_o[buf], grad_dim, lane);
    warp_tile_ab<kGradMTiles, kGradNBlocks, kBlockRows, true, kBlockCols, kHeadDim, Element>(
        acc_dk, tile.ds, grad_key, tile.q[buf], grad_dim, lane);

    if constexpr (kDq != DqMode::kSecondPass) {
      // dQ_i += dS K_j, this block's share, added into the fp32 accumulator at the warp's part of the
      // tile (DqShare).
      float acc_dq[Share::kMTiles][Share::kNBlocks][4] = {};
      warp_tile_ab<Share::kMTiles, Share::kNBlocks, kBlockCols, false, kBlockCols, kHeadDim, Element>(
          acc_dq, tile.ds, Share::first_row(warp), tile.k, Share::first_dim(warp), lane);
      const long long tile_index = bh * num_q_tiles + first_row / kBlockRows;
      float* part = dq_accum + (tile_index * Config::kWarps + warp) * Share::kWarpFloats;
      if constexpr (kDq == DqMode::kBulkAdd) {
        // Registers to the warp's staging buffer, conflict-free (each lane's 16 bytes, lane after lane),
        // and the copy engine adds the buffer while the warps go on: no register waits for the
        // additions. The copy of step - 1 has long finished reading the buffer; lane 0, which issued
        // it, makes sure before any lane writes.
        float* staging = dq_staging + warp * Share::kWarpFloats;
        if (lane == 0) bulk_wait_read<0>();
        __syncwarp();
#pragma unroll
        for (int m = 0; m < Share::kMTiles; ++m)
#pragma unroll
          for (int nb = 0; nb < Share::kNBlocks; ++nb)
            reinterpret_cast<float4*>(staging)[(m * Share::kNBlocks + nb) * 32 + lane] =
                make_float4(acc_dq[m][nb][0], acc_dq[m][nb][1], acc_dq[m][nb][2], acc_dq[m][nb][3]);
        fence_proxy_async_shared();  // each lane's stores, before the copy engine's reads
        __syncwarp();
        if (lane == 0) {
          bulk_reduce_add_f32(part, staging, Share::kWarpFloats * sizeof(float));
          bulk_commit();
        }
      } else {
#pragma unroll
        for (int m = 0; m < Share::kMTiles; ++m)
#pragma unroll
          for (int nb = 0; nb < Share::kNBlocks; ++nb) {
            float* dst = part + ((m * Share::kNBlocks + nb) * 32 + lane) * 4;
            red_add_f32x2(dst, acc_dq[m][nb][0], acc_dq[m][nb][1]);
            red_add_f32x2(dst + 2, acc_dq[m][nb][2], acc_dq[m][nb][3]);
          }
      }
    }
    current = next;
  }
  cp_async_wait<0>();  // nothing may be in flight when the block exits (num_steps = 0: K and V)
  if (kDq == DqMode::kBulkAdd && lane == 0) bulk_wait<0>();  // nor a bulk copy reading the staging buffers

  // dK = scale * dS^T Q and dV, rounded to Element; every key of the tile is written, zeros for keys
  // no query sees (causal).
#pragma unroll
  for (int m = 0; m < kGradMTiles; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = first_key + grad_key + m * kMmaM + group + 8 * half;
      if (key >= seq_kv) continue;
      const long long offset = (kv_head * seq_kv + key) * kHeadDim + grad_dim + 2 * thread_in_group;
#pragma unroll
      for (int nb = 0; nb < kGradNBlocks; ++nb) {
        *reinterpret_cast<uint32_t*>(dk + offset + nb * kMmaN) =
            pack2<Element>(acc_dk[m][nb][2 * half] * scale, acc_dk[m][nb][2 * half + 1] * scale);
        *reinterpret_cast<uint32_t*>(dv + offset + nb * kMmaN) =
            pack2<Element>(acc_dv[m][nb][2 * half], acc_dv[m][nb][2 * half + 1]);
      }
    }
}

// 3a. dQ = scale * the fp32 accumulator, rounded to Element, each row back in its place: thread i
// reads float4 number i of the accumulator (DqShare's layout: one lane's acc[m][nb][0..3] of one warp's
// part of one query tile) and writes its two pairs, to row r and row r + 8 of that tile.
template <typename Element, int kHeadDim, class Config>
__global__ void __launch_bounds__(256)
    convert_dq_kernel(const float* dq_accum, Element* dq, long long num_float4, int seq_q, int num_q_tiles,
                      float scale) {
  using namespace kernel_detail;
  using Share = DqShare<kHeadDim, Config>;
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_float4) return;
  const float4 a = reinterpret_cast<const float4*>(dq_accum)[i];
  const long long tile_index = i / (Share::kTileFloats / 4);
  const int in_tile = static_cast<int>(i % (Share::kTileFloats / 4));
  const int warp = in_tile / (Share::kWarpFloats / 4);
  const int fragment = in_tile % (Share::kWarpFloats / 4) / 32;  // m * kNBlocks + nb
  const int lane = in_tile % 32;
  const long long bh = tile_index / num_q_tiles;
  const int row = static_cast<int>(tile_index % num_q_tiles) * Config::kBlockRows + Share::first_row(warp) +
                  fragment / Share::kNBlocks * kMmaM + lane / 4;
  const int dim = Share::first_dim(warp) + fragment % Share::kNBlocks * kMmaN + 2 * (lane % 4);
  Element* out = dq + (bh * seq_q + row) * kHeadDim + dim;
  if (row < seq_q) *reinterpret_cast<uint32_t*>(out) = pack2<Element>(a.x * scale, a.y * scale);
  if (row + 8 < seq_q) *reinterpret_cast<uint32_t*>(out + 8 * kHeadDim) = pack2<Element>(a.z * scale, a.w * scale);
}

// 3b. Deterministic mode: dQ of one query tile, streaming K/V tiles in key order, recomputing
// S = Q K^T, P, dP = dO V^T and dS per tile; each warp owns 16 query rows and keeps their dQ in
// registers, so every element has one writer and one order of summation.
template <typename Element, int kHeadDim, bool kCausal, class Config>
__global__ void __launch_bounds__(Config::kWarps * 32, Config::kMinBlocksPerSm)
    dq_kernel(const Element* q, const Element* k, const Element* v, const Element* d_o, const float* lse,
              const float* d_rows, Element* dq, int heads_q, int heads_kv, int seq_q, int seq_kv, float scale,
              float scale_log2, int num_q_tiles, int num_heads_total) {
  using namespace kernel_detail;
  using Shared = QueryTileShared<Element, kHeadDim, Config>;
  constexpr int kThreads = Config::kWarps * 32;
  constexpr int kBlockRows = Config::kBlockRows;
  constexpr int kBlockCols = Config::kBlockCols;
  constexpr int kKeyBlocks = kBlockCols / kMmaN;  // accumulator n-blocks of S and dP per lane
  constexpr int kDimBlocks = kHeadDim / kMmaN;    // accumulator n-blocks of dQ per lane
  static_assert(kBlockCols % kMmaK == 0 && kKeyBlocks % 2 == 0 && kDimBlocks % 2 == 0, "whole k-steps, pairs");
  static_assert(sizeof(Shared) % 16 == 0 && sizeof(Element) == 2, "16-bit elements, 16-byte rows");
  extern __shared__ uint4 shared_raw[];
  Shared& tile = *reinterpret_cast<Shared*>(shared_raw);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;
  const int thread_in_group = lane % 4;
  const int warp_row = warp * kMmaM;

  // As stage 10's forward: causal, the longest query tile of every head first.
  long long bh;
  int q_tile;
  if (kCausal) {
    bh = blockIdx.x % num_heads_total;
    q_tile = num_q_tiles - 1 - static_cast<int>(blockIdx.x / num_heads_total);
  } else {
    bh = blockIdx.x / num_q_tiles;
    q_tile = static_cast<int>(blockIdx.x % num_q_tiles);
  }
  const int first_row = q_tile * kBlockRows;
  const int b = static_cast<int>(bh / heads_q);
  const int h = static_cast<int>(bh % heads_q);
  const long long kv_head = static_cast<long long>(b) * heads_kv + flash::kv_head_of(h, heads_q, heads_kv);
  const Element* k_head = k + kv_head * seq_kv * kHeadDim;
  const Element* v_head = v + kv_head * seq_kv * kHeadDim;
  const int diagonal = seq_kv - seq_q;

  load_rows_async<kBlockRows, kHeadDim, kThreads>(tile.q, q + bh * seq_q * kHeadDim, first_row, seq_q);
  load_rows_async<kBlockRows, kHeadDim, kThreads>(tile.d_o, d_o + bh * seq_q * kHeadDim, first_row, seq_q);

  // This lane's two rows (g and g + 8 of the warp's 16): their lse2 and D, in registers.
  float row_lse2[2], row_d[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = first_row + warp_row + group + 8 * half;
    const bool real = row < seq_q;
    row_lse2[half] = lse_base2(lse, bh * seq_q + row, real);
    row_d[half] = real ? d_rows[bh * seq_q + row] : 0.0f;
  }

  const int last_row = min(first_row + kBlockRows, seq_q) - 1;
  const int key_end = kCausal ? min(seq_kv, flash::causal_key_end(last_row, seq_q, seq_kv)) : seq_kv;
  const int num_tiles = key_end > 0 ? (key_end + kBlockCols - 1) / kBlockCols : 0;
  if (num_tiles > 0) {
    load_rows_async<kBlockCols, kHeadDim, kThreads>(tile.k[0], k_head, 0, seq_kv);
    load_rows_async<kBlockCols, kHeadDim, kThreads>(tile.v[0], v_head, 0, seq_kv);
  }
  cp_async_commit();

  float acc_dq[kDimBlocks][4] = {};
  for (int j = 0; j < num_tiles; ++j) {
    const int first_key = j * kBlockCols;
    const int buf = j % kStages;
    if (j + 1 < num_tiles) {
      load_rows_async<kBlockCols, kHeadDim, kThreads>(tile.k[1 - buf], k_head, first_key + kBlockCols, seq_kv);
      load_rows_async<kBlockCols, kHeadDim, kThreads>(tile.v[1 - buf], v_head, first_key + kBlockCols, seq_kv);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    // S = Q_i K_j^T and P = 2^(S * scale log2 e - lse2), masked where needed.
    float s[kKeyBlocks][4] = {};
    warp_gemm_abt<kKeyBlocks, kHeadDim, Element>(s, tile.q, warp_row, tile.k[buf], lane);
    const bool needs_mask =
        first_key + kBlockCols > seq_kv || (kCausal && first_key + kBlockCols - 1 > first_row + diagonal);
#pragma unroll
    for (int kb = 0; kb < kKeyBlocks; ++kb)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[kb][2 * half + e];
          float p = exp2_approx(fmaf(x, scale_log2, -row_lse2[half]));
          if (needs_mask) {
            const int key = first_key + kb * kMmaN + 2 * thread_in_group + e;
            const int row = first_row + warp_row + group + 8 * half;
            if (key >= seq_kv || (kCausal && key > row + diagonal)) p = 0.0f;
          }
          x = p;
        }

    // dP = dO_i V_j^T, then dS = P o (dP - D) in place.
    float dp[kKeyBlocks][4] = {};
    warp_gemm_abt<kKeyBlocks, kHeadDim, Element>(dp, tile.d_o, warp_row, tile.v[buf], lane);
#pragma unroll
    for (int kb = 0; kb < kKeyBlocks; ++kb)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        // TODO(exercise): the same dS = P o (dP - D), in place of dP, in the deterministic dQ pass:
        //   s[kb][2 * half + e] is P, row_d[half] the row's D. As shipped P is left out.
        //   Lesson: stages/11_backward_tc/README.md, "The math, from lesson 07".
        for (int e = 0; e < 2; ++e) dp[kb][2 * half + e] = dp[kb][2 * half + e] - row_d[half];  // placeholder
        // END TODO(exercise)

    // dQ_i += dS K_j: dS from its accumulators, K read transposed (as V in the forward's P V).
    warp_gemm_acc_b<kBlockCols, kDimBlocks, kHeadDim, Element>(acc_dq, dp, tile.k[buf], 0, lane);
    __syncthreads();  // every warp is done with buffer buf before it is refilled
  }
  cp_async_wait<0>();

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = first_row + warp_row + group + 8 * half;
    if (row >= seq_q) continue;
    Element* dq_row = dq + (bh * seq_q + row) * kHeadDim + 2 * thread_in_group;
#pragma unroll
    for (int db = 0; db < kDimBlocks; ++db)
      *reinterpret_cast<uint32_t*>(dq_row + db * kMmaN) =
          pack2<Element>(acc_dq[db][2 * half] * scale, acc_dq[db][2 * half + 1] * scale);
  }
}

}  // namespace stage11

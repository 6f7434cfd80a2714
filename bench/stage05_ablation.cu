// stage05-ablation: what each of stage 05's changes over stage 04 buys, measured.
//
// Stage 04 -> 05 changes about eight things at once. This program rebuilds the path between them as
// compile-time variants of ONE kernel template, ablation_kernel<head_dim, Config>, whose Config
// switches the changes on one at a time, cumulatively, in the order of the ladder below. The first
// rung is stage 04's own scheme; the last, with every switch on, is stage 05's kernel line for line
// (same tiles, same shared-memory layout, same arithmetic), and is checked to agree with
// stage05::forward. Stage 04 and stage 05 themselves (their real forward) are the two end points.
//
//   base      stage 04's scheme: 32 rows x 32 keys per tile, three block-wide steps with four
//             __syncthreads() per K/V tile, scores and P in a shared tile, one thread per row for
//             the softmax (exp against the tile max, then a rescale pass), one output column per
//             thread, scalar shared-memory loads, rows padded by 1 float
//   tiles     + stage 05's tile sizes: 64 rows, 64 keys (32 at head_dim 128)
//   oneexp    + one expf per score: merge the tile's max first, exponentiate against the new max
//   warprows  + warp-owned rows: each warp scores, normalizes and accumulates its own 16 rows in
//             its own part of the S tile, so two of the four barriers become __syncwarp()
//   regtile   + register tiles: 8 lanes per row, each thread holds 4 rows x Bc/8 scores and
//             4 rows x d/8 outputs in registers; row max/sum combined through shared memory
//   shuffle   + row max/sum by __shfl_xor_sync butterflies instead of shared memory
//   float4    + float4 shared-memory loads and stores of Q, K, V (rows unpadded: 16-byte aligned)
//   transp    + P stored transposed, so a thread's 4 rows for one key are one float4
//   pad4      + rows padded by 4 floats: stage 05's kernel
//
// The register-tile rungs before float4 (regtile, shuffle) read Q, K, V and P with scalar
// ld.shared.f32 written as inline PTX: the compiler would otherwise be free to fuse four aligned
// scalar loads (V's rows are unpadded) into one 16-byte load, and the float4 rung would measure
// less than it changes. The block-step rungs (base .. warprows) keep stage 04's plain loads, whose
// odd row strides leave nothing to fuse in the inner loops.
//
// Stage 06: the same kernel with the causal mask of stage 06 (Config::causal), with its
// heaviest-blocks-first order and with the natural block order, beside stage06::forward; and
// stage 06's causal and non-causal times at the same N, for the causal/non-causal ratio.
//
// Every variant is checked before it is timed: on small ragged problems against the fp64 reference
// (every row), and on the timed problem against the fp64 reference (a sample of rows) and against
// stage 05's (or 06's) output. A variant that fails is reported FAIL and not timed.
//
//   build/bin/stage05-ablation            the checks, then the table (scripts/device/gpu_check_ablation.sh
//                                         writes it to bench/results/h100_stage05_ablation.txt)
//   build/bin/stage05-ablation --quick    the small checks only (for compute-sanitizer)
//
// Exit status: 0 when every variant passed, 1 when one failed, 2 without a GPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_grid.h"
#include "causal.h"
#include "harness.h"
#include "reference.h"
#include "tiled.h"
#include "warp_shuffle.h"

// A named namespace: in an unnamed one nvcc warns about every Config member a rung does not read.
namespace ablation {

// ---------------------------------------------------------------------------------------------
// The kernel template
// ---------------------------------------------------------------------------------------------

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kWarpRows = 16;  // rows per warp once warps own rows (stage 05)
constexpr int kColLanes = 8;   // lanes sharing a row in the register-tile layout (stage 05)
constexpr int kRowLanes = 32 / kColLanes;
constexpr int kRowsPerThread = kWarpRows / kRowLanes;
static_assert(kRowsPerThread == 4, "a thread's rows travel as one float4 of P");
constexpr unsigned kFullWarp = 0xffffffffu;

// Stage 05's keys per tile: 64, or 32 at head_dim 128 (three blocks per SM either way).
constexpr int stage05_block_cols(int head_dim) { return head_dim <= 64 ? 64 : 32; }

// One rung of the ladder: which of stage 05's changes are on. Each switch needs the ones before it
// (checked below); causal and heaviest_first are stage 06's, on top of the full stage 05 kernel.
template <bool kTiles, bool kOneExp, bool kWarpOwned, bool kRegTile, bool kShuffle, bool kFloat4, bool kTransposedP,
          bool kPad4, bool kCausal = false, bool kHeaviestFirst = true>
struct Config {
  static constexpr bool tiles = kTiles;
  static constexpr bool one_exp = kOneExp;
  static constexpr bool warp_rows = kWarpOwned;
  static constexpr bool reg_tile = kRegTile;
  static constexpr bool shuffle = kShuffle;
  static constexpr bool float4_loads = kFloat4;
  static constexpr bool transposed_p = kTransposedP;
  static constexpr bool causal = kCausal;
  static constexpr bool heaviest_first = kHeaviestFirst;
  // Stage 04 pads by 1; float4 needs 16-byte rows, so 0 until the padding rung makes it 4.
  static constexpr int pad = kPad4 ? 4 : (kFloat4 ? 0 : 1);
  static constexpr int block_rows() { return kTiles ? kWarps * kWarpRows : 32; }
  static constexpr int block_cols(int head_dim) { return kTiles ? stage05_block_cols(head_dim) : 32; }

  static_assert(!kWarpOwned || kTiles, "warp-owned rows: 4 warps x 16 rows, stage 05's tile");
  static_assert(!kRegTile || (kWarpOwned && kOneExp), "register tiles come after warp-owned rows and one expf");
  static_assert(!kShuffle || kRegTile, "shuffles combine the lanes of a register-tiled row");
  static_assert(!kFloat4 || kRegTile, "float4 loads feed register tiles");
  static_assert(!kTransposedP || kFloat4, "transposed P is read as one float4 per key");
  static_assert(!kPad4 || kFloat4, "the padding of 4 keeps float4 rows aligned");
  static_assert(!kCausal || (kShuffle && kTransposedP && kPad4), "causal is stage 06: the full stage 05 kernel");
};

// The ladder. Each line switches on one more change.
using Base = Config<false, false, false, false, false, false, false, false>;
using Tiles = Config<true, false, false, false, false, false, false, false>;
using OneExp = Config<true, true, false, false, false, false, false, false>;
using WarpRows = Config<true, true, true, false, false, false, false, false>;
using RegTile = Config<true, true, true, true, false, false, false, false>;
using Shuffle = Config<true, true, true, true, true, false, false, false>;
using Float4 = Config<true, true, true, true, true, true, false, false>;
using TransposedP = Config<true, true, true, true, true, true, true, false>;
using Pad4 = Config<true, true, true, true, true, true, true, true>;  // stage 05
using CausalHeaviestFirst = Config<true, true, true, true, true, true, true, true, true, true>;  // stage 06
using CausalNaturalOrder = Config<true, true, true, true, true, true, true, true, true, false>;

// Shared memory of the block-step rungs (base .. warprows): stage 04's tiles at the rung's sizes.
template <int kHeadDim, class C>
struct BlockTiles {
  static constexpr int kBr = C::block_rows();
  static constexpr int kBc = C::block_cols(kHeadDim);
  float q[kBr][kHeadDim + C::pad];
  float k[kBc][kHeadDim + C::pad];
  float v[kBc][kHeadDim];
  float s[kBr][kBc + C::pad];  // scores, then unnormalized probabilities
  float rescale[kBr];          // per row: the factor for what was accumulated before this tile
  float normalizer[kBr];       // per row: 1 / row_sum after the last tile
};

// Shared memory of the register-tile rungs (regtile .. pad4): Q, K, V, then each warp's slice of P,
// transposed (stage 05's layout) or row by row, then, without shuffles, one slot per lane for the
// row reductions. With every switch on this is stage 05's SharedTiles, byte for byte.
template <int kBc, int kPad, bool kTransposed>
struct PSlice {
  using type = float[kWarps][kBc][kWarpRows];  // p[warp][key][row_lane * 4 + i]: row row_lane + kRowLanes * i
};
template <int kBc, int kPad>
struct PSlice<kBc, kPad, false> {
  using type = float[kWarps][kWarpRows][kBc + kPad];  // p[warp][row][key]
};
template <int kHeadDim, class C, bool kShuffle = C::shuffle>
struct RegTiles {
  static constexpr int kBr = C::block_rows();
  static constexpr int kBc = C::block_cols(kHeadDim);
  float q[kBr][kHeadDim + C::pad];
  float k[kBc][kHeadDim + C::pad];
  float v[kBc][kHeadDim];
  typename PSlice<kBc, C::pad, C::transposed_p>::type p;
  float red[kWarps][kWarpRows][kColLanes];  // one slot per lane and row, for the row max and sum
};
template <int kHeadDim, class C>
struct RegTiles<kHeadDim, C, true> {
  static constexpr int kBr = C::block_rows();
  static constexpr int kBc = C::block_cols(kHeadDim);
  float q[kBr][kHeadDim + C::pad];
  float k[kBc][kHeadDim + C::pad];
  float v[kBc][kHeadDim];
  typename PSlice<kBc, C::pad, C::transposed_p>::type p;
};

template <int kHeadDim, class C>
constexpr size_t shared_bytes() {
  if constexpr (C::reg_tile) {
    return sizeof(RegTiles<kHeadDim, C>);
  } else {
    return sizeof(BlockTiles<kHeadDim, C>);
  }
}

// One scalar shared-memory load that stays one: inline PTX, so the compiler cannot fuse neighbours
// into a vector load (see the file comment).
__device__ __forceinline__ float lds1(const float* p) {
  float x;
  asm volatile("ld.shared.f32 %0, [%1];"
               : "=f"(x)
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(p)))
               : "memory");
  return x;
}

// Four consecutive floats of shared memory: one float4 load, or four scalar loads.
template <bool kVector>
__device__ __forceinline__ float4 lds4(const float* p) {
  if constexpr (kVector) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    return make_float4(lds1(p), lds1(p + 1), lds1(p + 2), lds1(p + 3));
  }
}

template <bool kWarpOnly>
__device__ __forceinline__ void sync_rows() {
  if constexpr (kWarpOnly) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

// Copies rows [first, first + kRows) of a [num_rows, kHeadDim] matrix into a shared tile, zeros past
// num_rows: coalesced float4 reads, stored as one float4 (kVectorStore) or as four floats.
template <int kRows, int kHeadDim, bool kVectorStore, int kStride>
__device__ void load_tile(float (*tile)[kStride], const float* src, int first, int num_rows) {
  constexpr int kVecsPerRow = kHeadDim / 4;
  for (int e = threadIdx.x; e < kRows * kVecsPerRow; e += kThreads) {
    const int r = e / kVecsPerRow;
    const int c = (e % kVecsPerRow) * 4;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (first + r < num_rows) x = *reinterpret_cast<const float4*>(src + static_cast<long long>(first + r) * kHeadDim + c);
    if constexpr (kVectorStore) {
      *reinterpret_cast<float4*>(&tile[r][c]) = x;
    } else {
      tile[r][c] = x.x;
      tile[r][c + 1] = x.y;
      tile[r][c + 2] = x.z;
      tile[r][c + 3] = x.w;
    }
  }
}

// The rungs base .. warprows: stage 04's three steps per K/V tile.
template <int kHeadDim, class C>
__device__ __forceinline__ void block_steps(const float* q, const float* k, const float* v, float* o, float* lse,
                                            int heads_q, int heads_kv, int seq_q, int seq_kv, float scale,
                                            int num_q_tiles) {
  using Tiles = BlockTiles<kHeadDim, C>;
  constexpr int kBr = Tiles::kBr;
  constexpr int kBc = Tiles::kBc;
  extern __shared__ float4 shared_raw[];
  Tiles& tile = *reinterpret_cast<Tiles*>(shared_raw);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const long long bh = blockIdx.x / num_q_tiles;
  const int first_row = static_cast<int>(blockIdx.x % num_q_tiles) * kBr;
  const int b = static_cast<int>(bh / heads_q);
  const int h = static_cast<int>(bh % heads_q);
  const long long kv_head = static_cast<long long>(b) * heads_kv + flash::kv_head_of(h, heads_q, heads_kv);
  const float* k_head = k + kv_head * seq_kv * kHeadDim;
  const float* v_head = v + kv_head * seq_kv * kHeadDim;
  load_tile<kBr, kHeadDim, false>(tile.q, q + bh * seq_q * kHeadDim, first_row, seq_q);

  // Step 1: kScoreThreadsPerRow consecutive threads share a row. With 64 rows that is 2 per row, so
  // warp w computes the scores of rows 16w .. 16w + 15: the rows it owns from warprows on.
  constexpr int kScoreThreadsPerRow = kThreads / kBr;
  constexpr int kScoresPerThread = kBc / kScoreThreadsPerRow;
  static_assert(!C::warp_rows || kScoreThreadsPerRow * kWarpRows == 32, "a warp scores its own rows");
  const int score_row = threadIdx.x / kScoreThreadsPerRow;
  const int score_col = threadIdx.x % kScoreThreadsPerRow;

  // Step 2: one thread per row, thread r of the block (stage 04), or lane r < 16 of the warp that
  // owns the row (warprows).
  const bool owns_row = C::warp_rows ? lane < kWarpRows : threadIdx.x < kBr;
  const int own_row = C::warp_rows ? warp * kWarpRows + lane : static_cast<int>(threadIdx.x);
  flash::SoftmaxStats stats = flash::empty_softmax_stats();

  // Step 3: stage 04's mapping, one output column of every kRowGroups-th row of the block; or, with
  // warp-owned rows, columns lane + 32 m of the warp's 16 rows. Either way each multiply-add loads
  // its P and its V from shared memory.
  constexpr int kRowGroups = kThreads / kHeadDim;
  constexpr int kPvRows = C::warp_rows ? kWarpRows : kBr / kRowGroups;
  constexpr int kPvCols = C::warp_rows ? kHeadDim / 32 : 1;
  [[maybe_unused]] const int out_col = threadIdx.x % kHeadDim;
  [[maybe_unused]] const int out_row = threadIdx.x / kHeadDim;
  float acc_o[kPvRows][kPvCols] = {};

  for (int first_key = 0; first_key < seq_kv; first_key += kBc) {
    load_tile<kBc, kHeadDim, false>(tile.k, k_head, first_key, seq_kv);
    load_tile<kBc, kHeadDim, false>(tile.v, v_head, first_key, seq_kv);
    __syncthreads();

    // 1. Scores. Keys past seq_kv get -inf, so exp turns them into 0.
#pragma unroll
    for (int j = 0; j < kScoresPerThread; ++j) {
      const int key = score_col + j * kScoreThreadsPerRow;
      float dot = 0.0f;
#pragma unroll 16
      for (int c = 0; c < kHeadDim; ++c) dot += tile.q[score_row][c] * tile.k[key][c];
      tile.s[score_row][key] = first_key + key < seq_kv ? scale * dot : -INFINITY;
    }
    sync_rows<C::warp_rows>();

    // 2. Online softmax over the tile. Every tile holds at least one real key, so tile_max is finite.
    if (owns_row) {
      float* s_row = tile.s[own_row];
      float tile_max = -INFINITY;
      for (int j = 0; j < kBc; ++j) tile_max = fmaxf(tile_max, s_row[j]);
      float rescale_acc;
      if constexpr (C::one_exp) {
        // The new max first; every probability is then exp(s - new max), one expf each.
        float unused;
        stats = flash::merge_softmax_stats(stats, {tile_max, 0.0f}, &rescale_acc, &unused);
        float tile_sum = 0.0f;
        for (int j = 0; j < kBc; ++j) tile_sum += (s_row[j] = expf(s_row[j] - stats.row_max));
        stats.row_sum += tile_sum;
      } else {
        // Stage 04: exp against the tile's max, merge, then rescale the probabilities.
        float tile_sum = 0.0f;
        for (int j = 0; j < kBc; ++j) tile_sum += (s_row[j] = expf(s_row[j] - tile_max));
        float rescale_tile;
        stats = flash::merge_softmax_stats(stats, {tile_max, tile_sum}, &rescale_acc, &rescale_tile);
        for (int j = 0; j < kBc; ++j) s_row[j] *= rescale_tile;  // now exp(s - new row_max)
      }
      tile.rescale[own_row] = rescale_acc;
    }
    sync_rows<C::warp_rows>();

    // 3. O = O * rescale + P V.
    if constexpr (C::warp_rows) {
#pragma unroll
      for (int i = 0; i < kPvRows; ++i) {
        const int r = warp * kWarpRows + i;
        const float rescale = tile.rescale[r];
#pragma unroll
        for (int m = 0; m < kPvCols; ++m) {
          float acc = acc_o[i][m] * rescale;
#pragma unroll 8
          for (int j = 0; j < kBc; ++j) acc += tile.s[r][j] * tile.v[j][lane + 32 * m];
          acc_o[i][m] = acc;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPvRows; ++i) {
        const int r = out_row + i * kRowGroups;
        float acc = acc_o[i][0] * tile.rescale[r];
#pragma unroll 8
        for (int j = 0; j < kBc; ++j) acc += tile.s[r][j] * tile.v[j][out_col];
        acc_o[i][0] = acc;
      }
    }
    __syncthreads();  // the next tile overwrites k, v and s
  }

  if (owns_row) {
    tile.normalizer[own_row] = flash::softmax_normalizer(stats);
    const int row = first_row + own_row;
    if (lse && row < seq_q) lse[bh * seq_q + row] = flash::softmax_lse(stats);
  }
  sync_rows<C::warp_rows>();
  if constexpr (C::warp_rows) {
#pragma unroll
    for (int i = 0; i < kPvRows; ++i) {
      const int r = warp * kWarpRows + i;
      if (first_row + r >= seq_q) continue;
#pragma unroll
      for (int m = 0; m < kPvCols; ++m)
        o[(bh * seq_q + first_row + r) * kHeadDim + lane + 32 * m] = acc_o[i][m] * tile.normalizer[r];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPvRows; ++i) {
      const int r = out_row + i * kRowGroups;
      if (first_row + r < seq_q) o[(bh * seq_q + first_row + r) * kHeadDim + out_col] = acc_o[i][0] * tile.normalizer[r];
    }
  }
}

// The row max or sum over the kColLanes lanes that share a row: stage 05's butterfly, or each lane
// writing its value to a slot of shared memory and reading the row's eight slots back.
template <class C, bool kMax>
__device__ __forceinline__ float combine_row_lanes(float x, float* slots, int col_lane) {
  if constexpr (C::shuffle) {
#pragma unroll
    for (int offset = kColLanes / 2; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(kFullWarp, x, offset);
      x = kMax ? fmaxf(x, other) : x + other;
    }
    return x;
  } else {
    slots[col_lane] = x;
    __syncwarp();
    float r = slots[0];
#pragma unroll
    for (int c = 1; c < kColLanes; ++c) r = kMax ? fmaxf(r, slots[c]) : r + slots[c];
    __syncwarp();  // the next reduction overwrites the slots
    return r;
  }
}

// The rungs regtile .. pad4 (stage 05) and the causal variants (stage 06).
template <int kHeadDim, class C>
__device__ __forceinline__ void register_tiles(const float* q, const float* k, const float* v, float* o, float* lse,
                                               int heads_q, int heads_kv, int seq_q, int seq_kv, float scale,
                                               int num_q_tiles) {
  using Tiles = RegTiles<kHeadDim, C>;
  constexpr int kBlockRows = Tiles::kBr;
  constexpr int kBlockCols = Tiles::kBc;
  constexpr bool kVec = C::float4_loads;
  constexpr int kKeysPerThread = kBlockCols / kColLanes;  // keys col_lane + kColLanes * j
  constexpr int kOutVecs = kHeadDim / (4 * kColLanes);    // output float4s per row: cols col_lane*4 + 32*m
  extern __shared__ float4 shared_raw[];
  Tiles& tile = *reinterpret_cast<Tiles*>(shared_raw);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row_lane = lane / kColLanes;
  const int col_lane = lane % kColLanes;
  const int warp_row = warp * kWarpRows;

  const long long bh = blockIdx.x / num_q_tiles;
  // Stage 06, causal: a head's last query tiles have the most keys to visit; heaviest_first gives
  // them the lowest block indices, so they start first.
  const int q_tile = static_cast<int>(blockIdx.x % num_q_tiles);
  const int first_row = (C::causal && C::heaviest_first ? num_q_tiles - 1 - q_tile : q_tile) * kBlockRows;
  const int b = static_cast<int>(bh / heads_q);
  const int h = static_cast<int>(bh % heads_q);
  const long long kv_head = static_cast<long long>(b) * heads_kv + flash::kv_head_of(h, heads_q, heads_kv);
  const float* k_head = k + kv_head * seq_kv * kHeadDim;
  const float* v_head = v + kv_head * seq_kv * kHeadDim;
  load_tile<kBlockRows, kHeadDim, kVec>(tile.q, q + bh * seq_q * kHeadDim, first_row, seq_q);

  float acc_o[kRowsPerThread][kOutVecs * 4] = {};
  flash::SoftmaxStats stats[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) stats[i] = flash::empty_softmax_stats();

  // Keys any row of this block may see: up to the last row's limit when causal.
  const int last_row = min(first_row + kBlockRows, seq_q) - 1;
  const int key_end = C::causal ? min(seq_kv, flash::causal_key_end(last_row, seq_q, seq_kv)) : seq_kv;
  const int diagonal = seq_kv - seq_q;  // row i sees keys [0, i + diagonal + 1)

  for (int first_key = 0; first_key < key_end; first_key += kBlockCols) {
    load_tile<kBlockCols, kHeadDim, kVec>(tile.k, k_head, first_key, seq_kv);
    load_tile<kBlockCols, kHeadDim, kVec>(tile.v, v_head, first_key, seq_kv);
    __syncthreads();

    // S = Q K^T for this thread's rows and keys: per step of 4 columns, 4 + kKeysPerThread float4s
    // (or four times as many scalars) feed 16 * kKeysPerThread multiply-adds.
    float s[kRowsPerThread][kKeysPerThread] = {};
#pragma unroll 4
    for (int c = 0; c < kHeadDim; c += 4) {
      float4 q4[kRowsPerThread], k4[kKeysPerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) q4[i] = lds4<kVec>(&tile.q[warp_row + row_lane + kRowLanes * i][c]);
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) k4[j] = lds4<kVec>(&tile.k[col_lane + kColLanes * j][c]);
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kKeysPerThread; ++j)
          s[i][j] += q4[i].x * k4[j].x + q4[i].y * k4[j].y + q4[i].z * k4[j].z + q4[i].w * k4[j].w;
    }

    // Online softmax in registers. Causal: a tile that crosses the diagonal masks per element.
    const bool crosses_diagonal = C::causal && first_key + kBlockCols > first_row + diagonal + 1;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = first_row + warp_row + row_lane + kRowLanes * i;
      const int row_key_end = crosses_diagonal ? min(key_end, row + diagonal + 1) : seq_kv;
      float* slots = nullptr;
      if constexpr (!C::shuffle) slots = tile.red[warp][row_lane + kRowLanes * i];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        s[i][j] = first_key + col_lane + kColLanes * j < row_key_end ? s[i][j] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      tile_max = combine_row_lanes<C, true>(tile_max, slots, col_lane);
      float rescale_acc, unused;
      stats[i] = flash::merge_softmax_stats(stats[i], {tile_max, 0.0f}, &rescale_acc, &unused);
      // Causal: a row that has seen no key yet has row_max = -inf; exp(-inf - 0) keeps its masked
      // scores at 0 (stage 06). Without the mask every tile has a real key (stage 05).
      float exp_offset = stats[i].row_max;
      if constexpr (C::causal) exp_offset = stats[i].row_max == -INFINITY ? 0.0f : stats[i].row_max;
      float tile_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) tile_sum += (s[i][j] = expf(s[i][j] - exp_offset));
      stats[i].row_sum += combine_row_lanes<C, false>(tile_sum, slots, col_lane);
#pragma unroll
      for (int c = 0; c < kOutVecs * 4; ++c) acc_o[i][c] *= rescale_acc;
    }

    // P to this warp's slice of shared memory; only the warp's own lanes read it back.
    if constexpr (C::transposed_p) {
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j)
        *reinterpret_cast<float4*>(&tile.p[warp][col_lane + kColLanes * j][row_lane * 4]) =
            make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
    } else {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kKeysPerThread; ++j) tile.p[warp][row_lane + kRowLanes * i][col_lane + kColLanes * j] = s[i][j];
    }
    __syncwarp();

    // O += P V: per key, the thread's 4 probabilities and kOutVecs float4s of V feed 16 * kOutVecs
    // multiply-adds.
#pragma unroll 4
    for (int key = 0; key < kBlockCols; ++key) {
      float p_row[kRowsPerThread];
      if constexpr (C::transposed_p) {
        const float4 p4 = lds4<kVec>(&tile.p[warp][key][row_lane * 4]);
        p_row[0] = p4.x;
        p_row[1] = p4.y;
        p_row[2] = p4.z;
        p_row[3] = p4.w;
      } else {
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) p_row[i] = lds1(&tile.p[warp][row_lane + kRowLanes * i][key]);
      }
#pragma unroll
      for (int m = 0; m < kOutVecs; ++m) {
        const float4 v4 = lds4<kVec>(&tile.v[key][col_lane * 4 + 32 * m]);
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i) {
          acc_o[i][4 * m + 0] += p_row[i] * v4.x;
          acc_o[i][4 * m + 1] += p_row[i] * v4.y;
          acc_o[i][4 * m + 2] += p_row[i] * v4.z;
          acc_o[i][4 * m + 3] += p_row[i] * v4.w;
        }
      }
    }
    __syncthreads();  // the next tile overwrites k, v and p
  }

#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int row = first_row + warp_row + row_lane + kRowLanes * i;
    if (row >= seq_q) continue;
    const float normalizer = flash::softmax_normalizer(stats[i]);
    float* o_row = o + (bh * seq_q + row) * kHeadDim;
#pragma unroll
    for (int m = 0; m < kOutVecs; ++m)
      *reinterpret_cast<float4*>(o_row + col_lane * 4 + 32 * m) =
          make_float4(acc_o[i][4 * m] * normalizer, acc_o[i][4 * m + 1] * normalizer,
                      acc_o[i][4 * m + 2] * normalizer, acc_o[i][4 * m + 3] * normalizer);
    if (lse && col_lane == 0) lse[bh * seq_q + row] = flash::softmax_lse(stats[i]);
  }
}

// The one kernel template: a rung of the ladder is a Config.
template <int kHeadDim, class C>
__global__ void __launch_bounds__(kThreads)
    ablation_kernel(const float* q, const float* k, const float* v, float* o, float* lse, int heads_q, int heads_kv,
                    int seq_q, int seq_kv, float scale, int num_q_tiles) {
  if constexpr (C::reg_tile) {
    register_tiles<kHeadDim, C>(q, k, v, o, lse, heads_q, heads_kv, seq_q, seq_kv, scale, num_q_tiles);
  } else {
    block_steps<kHeadDim, C>(q, k, v, o, lse, heads_q, heads_kv, seq_q, seq_kv, scale, num_q_tiles);
  }
}

template <int kHeadDim, class C>
flash::Status launch(const float* q, const float* k, const float* v, float* o, float* lse, int batch, int heads_q,
                     int heads_kv, int seq_q, int seq_kv, float scale, cudaStream_t stream) {
  const auto kernel = ablation_kernel<kHeadDim, C>;
  constexpr size_t kSharedBytes = shared_bytes<kHeadDim, C>();
  const flash::Status status = flash::allow_shared_memory(kernel, kSharedBytes);
  if (!status.ok()) return status;
  constexpr int kBlockRows = C::block_rows();
  const int num_q_tiles = (seq_q + kBlockRows - 1) / kBlockRows;
  const long long blocks = static_cast<long long>(batch) * heads_q * num_q_tiles;
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSharedBytes, stream>>>(q, k, v, o, lse, heads_q, heads_kv, seq_q,
                                                                             seq_kv, scale, num_q_tiles);
  return flash::last_launch_status();
}

// ---------------------------------------------------------------------------------------------
// The variants: the ladder's rungs, and the stages as built at both ends
// ---------------------------------------------------------------------------------------------

using Forward = flash::Status (*)(const float* q, const float* k, const float* v, float* o, float* lse, int batch,
                                  int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                                  bool causal, cudaStream_t stream);

template <class C>
flash::Status rung(const float* q, const float* k, const float* v, float* o, float* lse, int batch, int heads_q,
                   int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, cudaStream_t stream) {
  if (causal != C::causal) return flash::make_status(flash::StatusCode::kNotSupported, "causal", causal);
  switch (head_dim) {
    case 64: return launch<64, C>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, stream);
    case 128: return launch<128, C>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, stream);
    default: return flash::make_status(flash::StatusCode::kHeadDimNotSupported, "head_dim", head_dim);
  }
}

template <flash::Status (*kStageForward)(const float*, const float*, const float*, float*, float*, int, int, int, int,
                                         int, int, float, bool, void*, size_t, cudaStream_t)>
flash::Status as_built(const float* q, const float* k, const float* v, float* o, float* lse, int batch, int heads_q,
                       int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal,
                       cudaStream_t stream) {
  return kStageForward(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, nullptr, 0,
                       stream);
}

// The problems a variant runs.
enum class Mode { kNonCausal, kCausal, kBoth };

struct Variant {
  const char* key;    // one word, what bench/results readers (scripts/docs/make_tables.py) look up
  const char* label;  // what it switches on, for the table
  Mode mode;          // non-causal problems, causal ones, or both
  Forward forward;
  bool runs(bool causal) const { return mode == Mode::kBoth || (mode == Mode::kCausal) == causal; }
};

// Non-causal: stage 04, the ladder, stage 05. Causal: stage 06 and the kernel in both orders.
const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
      {"s04", "stage 04 as built (stage04::forward)", Mode::kNonCausal, as_built<stage04::forward>},
      {"base", "stage 04's scheme in the ablation kernel: 32 x 32 tiles, 4 barriers, pad 1", Mode::kNonCausal, rung<Base>},
      {"tiles", "+ tiles of 64 rows x 64 keys (32 keys at d=128)", Mode::kNonCausal, rung<Tiles>},
      {"oneexp", "+ one expf per score (the max merged first, no rescale pass)", Mode::kNonCausal, rung<OneExp>},
      {"warprows", "+ warp-owned rows (2 of the 4 barriers become __syncwarp)", Mode::kNonCausal, rung<WarpRows>},
      {"regtile", "+ register tiles (4 rows x Bc/8 keys, 4 rows x d/8 columns per thread)", Mode::kNonCausal, rung<RegTile>},
      {"shuffle", "+ row max and sum by __shfl_xor_sync (not through shared memory)", Mode::kNonCausal, rung<Shuffle>},
      {"float4", "+ float4 shared-memory loads (rows unpadded, 16-byte aligned)", Mode::kNonCausal, rung<Float4>},
      {"transp", "+ P stored transposed (a thread's 4 rows of a key in one float4)", Mode::kNonCausal, rung<TransposedP>},
      {"pad4", "+ rows padded by 4 floats: stage 05's kernel", Mode::kNonCausal, rung<Pad4>},
      {"s05", "stage 05 as built (stage05::forward)", Mode::kNonCausal, as_built<stage05::forward>},
      {"s06", "stage 06 as built (stage06::forward)", Mode::kBoth, as_built<stage06::forward>},
      {"heavy", "stage 06's kernel, heaviest blocks first (as built)", Mode::kCausal, rung<CausalHeaviestFirst>},
      {"natural", "stage 06's kernel, blocks in natural order", Mode::kCausal, rung<CausalNaturalOrder>},
  };
  return all;
}

}  // namespace ablation

namespace {

using ablation::Variant;
using ablation::variants;

// ---------------------------------------------------------------------------------------------
// Checking and timing
// ---------------------------------------------------------------------------------------------

constexpr int kExitNoGpu = 2;
using bench_grid::kSeed;
using bench_grid::kTokens;  // the course grid: batch * seq = kTokens, kFp32Heads heads
constexpr int kHeads = bench_grid::kFp32Heads;
constexpr int kWarmup = 3;
constexpr int kRuns = 20;
constexpr long long kReferenceRows = 256;  // sampled rows of a timed problem checked in fp64

// Relative L2 error allowed against the fp64 reference and between two fp32 kernels (the runner's).
double tolerance() { return harness::agreement_tolerance(flash::DType::kFp32, flash::DType::kFp32); }

const Variant& find(const char* key) {
  for (const Variant& v : variants())
    if (std::strcmp(v.key, key) == 0) return v;
  throw std::invalid_argument(std::string("no variant ") + key);
}

harness::Problem problem(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, bool causal) {
  harness::Problem p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seq_q = seq_q;
  p.seq_kv = seq_kv;
  p.head_dim = head_dim;
  p.causal = causal;
  return p;
}

// One problem's inputs on the host and the device, and its output buffers.
struct Run {
  harness::Problem p;
  harness::HostInputs host;
  harness::DeviceInputs dev;
  harness::DeviceBuffer<float> o, lse;
  explicit Run(const harness::Problem& problem)
      : p(problem), host(harness::make_inputs(problem, kSeed)), dev(host),
        o(static_cast<size_t>(problem.q_elems())), lse(static_cast<size_t>(problem.rows())) {}
  flash::Status call(const Variant& v) {
    return v.forward(static_cast<const float*>(dev.q.get()), static_cast<const float*>(dev.k.get()),
                     static_cast<const float*>(dev.v.get()), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv,
                     p.seq_q, p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, nullptr);
  }
  // v's output, written over NaN; *why says what went wrong when it returns false.
  bool output(const Variant& v, std::vector<float>* out, std::string* why) {
    o.poison();
    const flash::Status status = call(v);
    const cudaError_t err = cudaDeviceSynchronize();
    if (!status.ok() || err != cudaSuccess) {
      *why = !status.ok() ? flash::to_string(status) : std::string("CUDA error: ") + cudaGetErrorString(err);
      return false;
    }
    *out = o.download();
    return true;
  }
};

struct Checked {
  bool pass = false;
  std::string why;         // what failed
  double vs_ref = 0.0;     // relative L2 error against the fp64 reference
  double vs_stage = -1.0;  // against the stage's output; < 0 when not compared
};

// v's output against the fp64 reference on `rows` (every row when empty) and, when given, against
// the stage's output.
Checked check(Run& run, const Variant& v, const std::vector<long long>& rows, const reference::ForwardRows& ref,
              const std::vector<float>* stage_o) {
  Checked c;
  std::vector<float> got;
  if (!run.output(v, &got, &c.why)) return c;
  const harness::ErrorStats e = rows.empty() ? harness::compare(got, ref.o)
                                             : harness::compare(harness::gather_rows(got, rows, run.p.head_dim), ref.o);
  c.vs_ref = e.rel_l2;
  c.pass = e.within(tolerance());
  if (!c.pass) c.why = "against the fp64 reference: " + e.describe();
  if (stage_o) {
    const harness::ErrorStats s = harness::compare(got, *stage_o);
    c.vs_stage = s.rel_l2;
    if (!s.within(tolerance())) {
      c.pass = false;
      c.why += (c.why.empty() ? "" : "; ") + std::string("against the stage: ") + s.describe();
    }
  }
  return c;
}

// Small problems with partial tiles on both sides, GQA, and (causal) rows that see no key: every
// row of every variant against the fp64 reference. Returns the keys of the variants that failed.
// `quick` (for compute-sanitizer, which is slow) leaves out the largest.
std::vector<std::string> small_checks(bool quick) {
  std::vector<std::string> failed;
  for (int head_dim : {64, 128}) {
    std::vector<harness::Problem> problems = {
        problem(1, 4, 2, 130, 77, head_dim, false),
        problem(1, 2, 1, 200, 77, head_dim, true),
        problem(1, 4, 2, 77, 200, head_dim, true),
    };
    if (!quick) {
      problems.push_back(problem(2, 2, 2, 65, 200, head_dim, false));
      problems.push_back(problem(2, 2, 2, 300, 300, head_dim, true));
    }
    for (const harness::Problem& p : problems) {
      Run run(p);
      const reference::ForwardRows ref = reference::forward(p, run.host);
      for (const Variant& v : variants()) {
        if (!v.runs(p.causal)) continue;
        const Checked c = check(run, v, {}, ref, nullptr);
        std::printf("# check %-8s %s: rel_l2 vs fp64 %.1e %s%s\n", v.key, p.describe().c_str(), c.vs_ref,
                    c.pass ? "PASS" : "FAIL: ", c.why.c_str());
        if (!c.pass) failed.push_back(v.key);
      }
    }
  }
  std::fflush(stdout);
  return failed;
}

bool contains(const std::vector<std::string>& keys, const std::string& key) {
  for (const std::string& k : keys)
    if (k == key) return true;
  return false;
}

// The variants `keys` on the course grid at seq: each checked against the fp64 reference on sampled
// rows and against `stage_key`'s output, then timed; one line each:
//   d64   causal=0 N=4096   tiles       12.345 ms   11.13 TFLOP/s PASS vs_fp64=6.0e-07 vs_s05=5.1e-07 | label
//   d64   causal=0 N=4096   tiles    FAIL, not timed: why | label
// Returns false when one failed.
bool measure(int head_dim, int seq, bool causal, const char* stage_key, const std::vector<std::string>& keys,
             const std::vector<std::string>& failed_small) {
  Run run(problem(bench_grid::batch_for(seq), kHeads, kHeads, seq, seq, head_dim, causal));
  const std::vector<long long> rows = harness::sample_rows(run.p.rows(), kReferenceRows);
  const reference::ForwardRows ref = reference::forward_rows(run.p, run.host, rows);
  std::vector<float> stage_o;
  std::string why;
  const bool have_stage = run.output(find(stage_key), &stage_o, &why);
  bool all_pass = true;
  for (const std::string& key : keys) {
    const Variant& v = find(key.c_str());
    Checked c;
    if (!have_stage) {
      c.why = std::string(stage_key) + ", the stage compared with, failed: " + why;
    } else if (contains(failed_small, key)) {
      c.why = "failed a small check (the '# check' lines)";
    } else {
      c = check(run, v, rows, ref, &stage_o);
    }
    std::printf("d%-4d causal=%d N=%-6d %-8s ", head_dim, causal ? 1 : 0, seq, v.key);
    flash::Status status;
    harness::Timing t;
    if (c.pass) {
      t = harness::time_cuda([&] { status = run.call(v); }, kWarmup, kRuns);
      if (!status.ok()) {
        c.pass = false;
        c.why = flash::to_string(status);
      }
    }
    if (!c.pass) {
      all_pass = false;
      std::printf("FAIL, not timed: %s | %s\n", c.why.c_str(), v.label);
    } else {
      const double tflops = harness::forward_flops(run.p) / (t.median_ms * 1e-3) / 1e12;
      std::printf("%9.3f ms %7.2f TFLOP/s PASS vs_fp64=%.1e vs_%s=%.1e | %s\n", t.median_ms, tflops, c.vs_ref,
                  stage_key, c.vs_stage, v.label);
    }
    std::fflush(stdout);
  }
  return all_pass;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  std::string why;
  if (!harness::gpu_available(&why)) {
    std::fprintf(stderr, "stage05-ablation: %s\n", why.c_str());
    return kExitNoGpu;
  }
  try {
    cudaDeviceProp prop{};
    harness::cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::printf("# stage05-ablation on %s: fp32, course grid (batch * seq = %d tokens, %d heads); CUDA events, %d "
                "warm-up runs, median of %d; a variant is timed only after it matched the fp64 reference and the "
                "stage (relative L2 <= %.0e)\n",
                prop.name, kTokens, kHeads, kWarmup, kRuns, tolerance());
    const std::vector<std::string> failed = small_checks(quick);
    if (quick) return failed.empty() ? 0 : 1;

    bool ok = failed.empty();
    // Stage 04 -> 05, one change at a time, and stage 06 without the mask (= stage 05).
    const std::vector<std::string> ladder = {"s04",     "base",    "tiles",  "oneexp", "warprows", "regtile",
                                             "shuffle", "float4",  "transp", "pad4",   "s05",      "s06"};
    for (int head_dim : bench_grid::head_dims()) ok = measure(head_dim, 4096, false, "s05", ladder, failed) && ok;
    // Stage 06: its block order, and causal against non-causal at the same N.
    for (int head_dim : bench_grid::head_dims())
      for (int seq : {4096, 16384}) {
        ok = measure(head_dim, seq, true, "s06", {"s06", "heavy", "natural"}, failed) && ok;
        if (seq != 4096) ok = measure(head_dim, seq, false, "s05", {"s05", "s06"}, failed) && ok;
      }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("# stage05-ablation: %s\n", e.what());
    return 1;
  }
}

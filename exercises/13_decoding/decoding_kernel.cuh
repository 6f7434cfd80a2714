// Stage 13's two kernels. decoding.cu plans the splits and launches them.
//
// split_kernel: one block of four warps per (sequence, K/V head, split, 16-row tile). The block's
//   rows are the query rows of the K/V group (heads_q / heads_kv heads times seq_q queries), so every
//   K/V element it reads serves all of them. Its keys arrive in steps of 64 (kBlockKeys) through a
//   cp.async pipeline several steps deep; each warp takes 16 of the 64 keys of a step and keeps its
//   own online softmax (max, sum, O) over the keys it saw, in registers, with S = Q K^T and O += P V
//   on the tensor cores (the fragments of stage 10). At the end the four warps' results are merged
//   in shared memory (stage 03's rescale) into the block's partial (o, lse), written in fp32 to the
//   workspace, or, when there is only one split, as the final o and lse.
// merge_kernel: per query row, the splits' partial results merged in split order with
//   flash::merge_softmax_stats, the online-softmax merge of stage 03.
//
// K and V come from a Cache: ContiguousCache ([batch, heads_kv, seq_kv, head_dim]) or PagedCache
// (pages through a page table, a length per sequence). The kernel is the same for both: a cache
// answers how many keys a sequence has and where the row of a key is.
#pragma once

#include "decoding.h"
#include "flash_stage.cuh"
#include "tensor_core.cuh"

namespace stage13 {
namespace kernel_detail {

using tensor_core::cp_async_16;
using tensor_core::cp_async_commit;
using tensor_core::cp_async_wait;
using tensor_core::exp2_approx;
using tensor_core::kLn2;
using tensor_core::kLog2e;
using tensor_core::ldmatrix_x4;
using tensor_core::ldmatrix_x4_trans;
using tensor_core::max_over_row_lanes;
using tensor_core::mma_m16n8k16;
using tensor_core::pack2;
using tensor_core::sum_over_row_lanes;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpKeys = 16;  // keys of a step per warp: one k-step of O += P V
static_assert(kWarps * kWarpKeys == kBlockKeys, "a step is one 16-key slice per warp");
constexpr int kMmaK = 16;     // the K of mma.m16n8k16
constexpr int kMmaN = 8;      // the N of mma.m16n8k16
static_assert(kBlockRows == 16, "one m16 tile of rows per block");
constexpr int kVecElems = 8;  // 16-byte vectors of 16-bit elements
constexpr int kMinBlocksPerSm = 2;             // __launch_bounds__: registers for two blocks per SM
constexpr int kMergeBatch = 8;  // partials merge_kernel loads at once: 8 float4 and 8 lse in registers

// Pipeline steps in shared memory: three at head_dim 128 (32 KiB each: 96 KiB per block, two blocks
// per H100 SM), four at 64 (16 KiB each). While a block computes on one step, the others are in
// flight: 64 or 48 KiB of reads per block, which is what keeps HBM busy.
template <int kHeadDim>
struct Pipeline {
  static constexpr int kStages = kHeadDim == 64 ? 4 : 3;
};

// One pipeline step: kBlockKeys rows of K and of V, each row swizzled (swizzled()).
template <typename Element, int kHeadDim>
struct StepTiles {
  Element k[kBlockKeys][kHeadDim];
  Element v[kBlockKeys][kHeadDim];
};

// The epilogue's view of the same shared memory: each warp's unnormalized O and its per-row
// statistics. Rows are padded by 8 floats so that the warp's float2 stores (rows g, columns 2t) fall
// in distinct banks.
template <int kHeadDim>
struct WarpResults {
  static constexpr int kStride = kHeadDim + 8;
  float o[kWarps][kBlockRows][kStride];
  float row_max2[kWarps][kBlockRows];  // base 2, as in the loop
  float row_sum[kWarps][kBlockRows];
};

template <typename Element, int kHeadDim>
constexpr int shared_bytes() {
  constexpr int tiles = Pipeline<kHeadDim>::kStages * static_cast<int>(sizeof(StepTiles<Element, kHeadDim>));
  constexpr int results = static_cast<int>(sizeof(WarpResults<kHeadDim>));
  return tiles > results ? tiles : results;
}

// Stage 09's swizzle for rows of 8 or more 16-byte chunks (head_dim 64 and 128): chunk c of row r is
// stored at chunk c ^ (r % 8), so that the 8 rows an ldmatrix reads lie in 8 different bank groups.
__device__ inline int swizzled(int row, int col) {
  return (((col / kVecElems) ^ (row & 7)) * kVecElems) + col % kVecElems;
}

}  // namespace kernel_detail

// K and V stored contiguously, [batch, heads_kv, seq_kv, head_dim]: every sequence has seq_kv keys.
template <typename Element, int kHeadDim>
struct ContiguousCache {
  const Element* k;
  const Element* v;
  int heads_kv;
  int seq_kv;

  __device__ int length(int /*b*/) const { return seq_kv; }
  // The element offset of key `key` (0 <= key < length(b)) of sequence b and K/V head g.
  __device__ long long row_offset(int b, int g, int key) const {
    return ((static_cast<long long>(b) * heads_kv + g) * seq_kv + key) * kHeadDim;
  }
};

// K and V in pages, [num_pages, page_size, heads_kv, head_dim] each, found through page_table
// [batch, max_pages_per_seq]; sequence b has cache_lens[b] keys. page_size = 1 << page_shift.
template <typename Element, int kHeadDim>
struct PagedCache {
  const Element* k;
  const Element* v;
  const int* page_table;
  const int* cache_lens;
  int heads_kv;
  int page_shift;
  int num_pages;
  int max_pages_per_seq;

  // cache_lens[b] clamped to what the page table can hold: a bad length reads no page past the table.
  __device__ int length(int b) const {
    const long long capacity = static_cast<long long>(max_pages_per_seq) << page_shift;  // <= kMaxDim (host)
    const long long n = __ldg(cache_lens + b);
    return static_cast<int>(n < 0 ? 0 : (n > capacity ? capacity : n));
  }
  // The element offset of key `key` (0 <= key < length(b)), or -1 when its page-table entry names
  // no page of the cache (then the key is not read).
  __device__ long long row_offset(int b, int g, int key) const {
    const int page = __ldg(page_table + static_cast<long long>(b) * max_pages_per_seq + (key >> page_shift));
    if (page < 0 || page >= num_pages) return -1;
    const long long slot = (static_cast<long long>(page) << page_shift) + (key & ((1 << page_shift) - 1));
    return (slot * heads_kv + g) * kHeadDim;
  }
};

namespace kernel_detail {

// Starts copying keys [first, first + kBlockKeys) of (sequence b, K/V head g) into one pipeline step;
// a key at or past key_end, or whose row the cache cannot place, is zero-filled, not read. Zeros
// matter: a masked score has P = 0, and 0 * V is 0 only for a finite V.
template <typename Element, int kHeadDim, class Cache>
__device__ void load_step(StepTiles<Element, kHeadDim>& tile, const Cache& cache, int b, int g, int first,
                          int key_end) {
  constexpr int kVecsPerRow = kHeadDim / kVecElems;
  constexpr int kVecs = kBlockKeys * kVecsPerRow;  // 16-byte vectors of K in a step, and as many of V
  static_assert(kVecs % kThreads == 0, "every thread copies the same number of vectors");
  // A trip count the compiler knows (lesson 10): the loop unrolls. Each copy keeps its row offset and
  // bounds check (a paged cache, a split that ends inside a step).
#pragma unroll
  for (int i = 0; i < kVecs / kThreads; ++i) {
    const int e = threadIdx.x + i * kThreads;
    const int r = e / kVecsPerRow;
    const int c = (e % kVecsPerRow) * kVecElems;
    const int key = first + r;
    const long long offset = key < key_end ? cache.row_offset(b, g, key) : -1;
    const bool valid = offset >= 0;
    const long long at = valid ? offset + c : 0;  // an invalid copy reads nothing; its address stays in bounds
    cp_async_16(&tile.k[r][swizzled(r, c)], cache.k + at, valid);
    cp_async_16(&tile.v[r][swizzled(r, c)], cache.v + at, valid);
  }
}

// 32 bits (two elements) of Q.
template <typename Element>
__device__ inline uint32_t load_pair(const Element* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

}  // namespace kernel_detail

// What every block of one launch shares.
struct SplitParams {
  int heads_q;
  int heads_kv;
  int seq_q;
  int group_rows;   // heads_q / heads_kv * seq_q: the query rows of one K/V group
  int row_tiles;    // ceil(group_rows / kBlockRows)
  int num_splits;   // splits of each sequence's keys
  long long rows;   // batch * heads_q * seq_q: rows of o and lse
  float scale_log2;  // scale * log2(e): scores in base 2, as in stage 10
  bool causal;
};

template <typename Element, int kHeadDim, class Cache>
__global__ void __launch_bounds__(kernel_detail::kThreads, kernel_detail::kMinBlocksPerSm)
    split_kernel(const Element* q, Cache cache, Element* o, float* lse, float* partial_o, float* partial_lse,
                 SplitParams p) {
  using namespace kernel_detail;
  constexpr int kStages = Pipeline<kHeadDim>::kStages;
  constexpr int kDimSteps = kHeadDim / kMmaK;   // k-steps of S = Q K^T
  constexpr int kDimBlocks = kHeadDim / kMmaN;  // n-blocks of O
  extern __shared__ uint4 shared_raw[];
  StepTiles<Element, kHeadDim>* steps = reinterpret_cast<StepTiles<Element, kHeadDim>*>(shared_raw);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;            // g: the lane's rows are g and g + 8 of the block's 16
  const int thread_in_group = lane % 4;  // t: its columns 2t and 2t + 1 of each 8-wide block

  // The merge may be scheduled now: it waits for this whole grid before it reads a partial, so its
  // launch and block start-up overlap this grid's work instead of following its last block.
  tensor_core::grid_launch_dependents();

  // The block's place: row tiles innermost, so the tiles of one K/V group run side by side and read
  // the same keys at the same time (every read after the first comes from L2).
  long long id = blockIdx.x;
  const int row_tile = static_cast<int>(id % p.row_tiles);
  id /= p.row_tiles;
  const int split = static_cast<int>(id % p.num_splits);
  id /= p.num_splits;
  const int g = static_cast<int>(id % p.heads_kv);
  const int b = static_cast<int>(id / p.heads_kv);

  // This split's keys: the sequence's length shared among the splits in whole steps.
  const long long len = cache.length(b);
  const long long per_split = ((len + p.num_splits - 1) / p.num_splits + kBlockKeys - 1) / kBlockKeys * kBlockKeys;
  const int key_begin = static_cast<int>(min(len, split * per_split));
  const int key_end = static_cast<int>(min(len, key_begin + per_split));
  const int num_steps = (key_end - key_begin + kBlockKeys - 1) / kBlockKeys;

  // The first loads go out before anything else.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_steps) load_step(steps[s], cache, b, g, key_begin + s * kBlockKeys, key_end);
    cp_async_commit();  // an empty group where there is no step: the wait counts stay uniform
  }

  // Row r of the block is row 16 row_tile + r of the group: head g * group_size + that / seq_q,
  // query that % seq_q. The group's rows are contiguous in q, o and lse.
  const int rows_here = min(kBlockRows, p.group_rows - row_tile * kBlockRows);
  const long long first_row =
      (static_cast<long long>(b) * p.heads_q + static_cast<long long>(g) * (p.heads_q / p.heads_kv)) * p.seq_q +
      static_cast<long long>(row_tile) * kBlockRows;

  // Q's A operands straight from global memory into registers, loaded once (zeros past the group's
  // rows): a[0] row g, columns 16 ks + 2t..; a[1] row g + 8; a[2], a[3] the same 8 columns on.
  uint32_t q_frag[kDimSteps][4];
  {
    const bool valid0 = group < rows_here, valid1 = group + 8 < rows_here;
    const Element* q0 = q + (first_row + (valid0 ? group : 0)) * kHeadDim;
    const Element* q1 = q + (first_row + (valid1 ? group + 8 : 0)) * kHeadDim;
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      const int c = ks * kMmaK + 2 * thread_in_group;
      q_frag[ks][0] = valid0 ? load_pair(q0 + c) : 0u;
      q_frag[ks][1] = valid1 ? load_pair(q1 + c) : 0u;
      q_frag[ks][2] = valid0 ? load_pair(q0 + c + 8) : 0u;
      q_frag[ks][3] = valid1 ? load_pair(q1 + c + 8) : 0u;
    }
  }

  // Where each of the lane's two rows stops seeing keys (bottom-right causal: query i sees the keys
  // before len - seq_q + i + 1), and the key before which every row of the block sees everything:
  // only a slice that reaches past it pays for the mask.
  int row_key_end[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int query = (row_tile * kBlockRows + group + 8 * half) % p.seq_q;
    row_key_end[half] =
        p.causal ? static_cast<int>(min(static_cast<long long>(key_end), len - p.seq_q + query + 1)) : key_end;
  }
  const int mask_from = p.causal ? static_cast<int>(min(static_cast<long long>(key_end), len - p.seq_q + 1)) : key_end;

  float acc_o[kDimBlocks][4] = {};
  float row_max2[2] = {-INFINITY, -INFINITY};  // base 2, per half (row g, row g + 8)
  float row_sum[2] = {0.0f, 0.0f};             // this lane's share; summed over the 4 lanes at the end

  for (int step = 0; step < num_steps; ++step) {
    cp_async_wait<kStages - 2>();  // this thread's copies of `step` have landed
    __syncthreads();               // everyone's have; and everyone is done with step - 1's buffer
    {
      const int next = step + kStages - 1;  // into the buffer step - 1 used
      if (next < num_steps) load_step(steps[next % kStages], cache, b, g, key_begin + next * kBlockKeys, key_end);
      cp_async_commit();
    }
    const StepTiles<Element, kHeadDim>& tile = steps[step % kStages];
    const int first_key = key_begin + step * kBlockKeys + warp * kWarpKeys;
    if (first_key >= key_end) continue;  // this warp's slice lies past the split: nothing to see

    // S = Q K^T for the warp's 16 keys (rows 16 warp .. 16 warp + 15 of the step).
    float s[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      uint32_t k_frag[4];
      const int r = warp * kWarpKeys + (lane / 16) * 8 + lane % 8;
      ldmatrix_x4(k_frag, &tile.k[r][swizzled(r, ks * kMmaK + ((lane / 8) % 2) * 8)]);
      mma_m16n8k16<Element>(s[0], q_frag[ks], k_frag[0], k_frag[1]);
      mma_m16n8k16<Element>(s[1], q_frag[ks], k_frag[2], k_frag[3]);
    }

    // Online softmax per row, in base 2 (stage 10): scale, mask where needed, rescale what was there.
    const bool needs_mask = first_key + kWarpKeys > mask_from;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int kb = 0; kb < 2; ++kb)
#pragma unroll
        for (int e = 0; e < 2; ++e) s[kb][2 * half + e] *= p.scale_log2;
      if (needs_mask) {
#pragma unroll
        for (int kb = 0; kb < 2; ++kb)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (first_key + kb * kMmaN + 2 * thread_in_group + e >= row_key_end[half]) s[kb][2 * half + e] = -INFINITY;
      }
      float slice_max = -INFINITY;
#pragma unroll
      for (int kb = 0; kb < 2; ++kb)
#pragma unroll
        for (int e = 0; e < 2; ++e) slice_max = fmaxf(slice_max, s[kb][2 * half + e]);
      const float new_max2 = fmaxf(row_max2[half], max_over_row_lanes(slice_max));
      // -inf only while the row has seen no key; 0 then keeps its masked 2^(-inf) at 0.
      const float offset2 = new_max2 == -INFINITY ? 0.0f : new_max2;
      const float rescale = exp2_approx(row_max2[half] - offset2);
      row_max2[half] = new_max2;
      float slice_sum = 0.0f;
#pragma unroll
      for (int kb = 0; kb < 2; ++kb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& score = s[kb][2 * half + e];
          score = exp2_approx(score - offset2);
          slice_sum += score;
        }
      row_sum[half] = row_sum[half] * rescale + slice_sum;
#pragma unroll
      for (int db = 0; db < kDimBlocks; ++db) {
        acc_o[db][2 * half] *= rescale;
        acc_o[db][2 * half + 1] *= rescale;
      }
    }

    // O += P V: P is the A operand as it stands in registers (stage 08's trick), V comes transposed.
    const uint32_t p_frag[4] = {pack2<Element>(s[0][0], s[0][1]), pack2<Element>(s[0][2], s[0][3]),
                                pack2<Element>(s[1][0], s[1][1]), pack2<Element>(s[1][2], s[1][3])};
#pragma unroll
    for (int db = 0; db < kDimBlocks; db += 2) {
      uint32_t v_frag[4];
      const int r = warp * kWarpKeys + ((lane / 8) % 2) * 8 + lane % 8;
      ldmatrix_x4_trans(v_frag, &tile.v[r][swizzled(r, db * kMmaN + (lane / 16) * 8)]);
      mma_m16n8k16<Element>(acc_o[db], p_frag, v_frag[0], v_frag[1]);
      mma_m16n8k16<Element>(acc_o[db + 1], p_frag, v_frag[2], v_frag[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the steps' buffers: the epilogue reuses that memory

  // The four warps saw disjoint keys: merge their results per row, stage 03's rescale in base 2.
  WarpResults<kHeadDim>& results = *reinterpret_cast<WarpResults<kHeadDim>*>(shared_raw);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = group + 8 * half;
    const float sum = sum_over_row_lanes(row_sum[half]);
    if (thread_in_group == 0) {
      results.row_max2[warp][r] = row_max2[half];
      results.row_sum[warp][r] = sum;
    }
#pragma unroll
    for (int db = 0; db < kDimBlocks; ++db)
      *reinterpret_cast<float2*>(&results.o[warp][r][db * kMmaN + 2 * thread_in_group]) =
          make_float2(acc_o[db][2 * half], acc_o[db][2 * half + 1]);
  }
  __syncthreads();

  constexpr int kChunks = kHeadDim / 4;  // float4 chunks of a row
  for (int e = threadIdx.x; e < kBlockRows * kChunks; e += kThreads) {
    const int r = e / kChunks;
    const int c = (e % kChunks) * 4;
    if (r >= rows_here) continue;
    float max2 = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) max2 = fmaxf(max2, results.row_max2[w][r]);
    float sum = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (max2 != -INFINITY) {  // else no warp saw a key of this row: sum and O stay 0
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(results.row_max2[w][r] - max2);  // 0 for a warp that saw no key
        sum += results.row_sum[w][r] * f;
        const float4 x = *reinterpret_cast<const float4*>(&results.o[w][r][c]);
        acc.x += x.x * f;
        acc.y += x.y * f;
        acc.z += x.z * f;
        acc.w += x.w * f;
      }
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // a row that saw no key: O = 0
    const float row_lse = sum > 0.0f ? (max2 + log2f(sum)) * kLn2 : -INFINITY;
    const long long row = first_row + r;
    if (p.num_splits == 1) {  // the only split: this is the answer
      *reinterpret_cast<uint2*>(o + row * kHeadDim + c) =
          make_uint2(pack2<Element>(acc.x * inv, acc.y * inv), pack2<Element>(acc.z * inv, acc.w * inv));
      if (lse && c == 0) lse[row] = row_lse;
    } else {  // a partial: normalized o and its lse, for merge_kernel
      const long long at = split * p.rows + row;
      *reinterpret_cast<float4*>(partial_o + at * kHeadDim + c) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (c == 0) partial_lse[at] = row_lse;
    }
  }
}

// One thread per 4 columns of a query row: the row's partials merged in split order. A partial is a
// normalized o_s with its lse_s, which is exactly the statistics {max = lse_s, sum = 1} with o_s as
// the accumulator (sum_j exp(s_j - lse_s) v_j = o_s): stage 03's merge applies unchanged, and a split
// that saw no key ({-inf, 0}) changes nothing. The fixed order makes the result deterministic.
// The partials are read kMergeBatch splits at a time, every load of a batch issued before the first
// merge: the merge is a chain (each step needs the last), but its loads are not, and one load after
// another would pay the memory latency once per split.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(256)
    merge_kernel(const float* partial_o, const float* partial_lse, Element* o, float* lse, long long rows,
                 int num_splits) {
  using kernel_detail::kMergeBatch;
  constexpr int kChunks = kHeadDim / 4;
  const long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= rows * kChunks) return;
  const long long row = e / kChunks;
  const int c = static_cast<int>(e % kChunks) * 4;
  tensor_core::grid_dependency_wait();  // every partial written by split_kernel, and visible
  flash::SoftmaxStats stats = flash::empty_softmax_stats();
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int first = 0; first < num_splits; first += kMergeBatch) {
    float part_lse[kMergeBatch];
    float4 part_o[kMergeBatch];
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      const long long at = (first + i) * rows + row;
      const bool here = first + i < num_splits;  // past the last split: an empty partial, {-inf, 0}
      part_lse[i] = here ? partial_lse[at] : -INFINITY;
      part_o[i] = here ? *reinterpret_cast<const float4*>(partial_o + at * kHeadDim + c)
                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) {
      // TODO(exercise): merge split i into the running result: `stats` (a flash::SoftmaxStats) and
      //   `acc` (four columns of the unnormalized O). Split i's o is normalized, part_o[i], with its
      //   lse, part_lse[i]; a split that saw no key has lse = -inf. Which statistics {row_max, row_sum}
      //   describe a normalized o with its lse? Then stage 03's merge (flash::merge_softmax_stats)
      //   gives the factors for acc and for part_o[i]. After the loop, acc / stats.row_sum is O and
      //   softmax_lse(stats) the row's lse. As shipped the last split that saw a key wins.
      //   Checked on the CPU too: ctest -L exercise13 (tests/test_exercise_ideas.cpp).
      //   Lesson: stages/13_decoding/README.md, "The split and the merge".
      if (part_lse[i] != -INFINITY) {  // placeholder
        stats = {part_lse[i], 1.0f};
        acc = part_o[i];
      }
      // END TODO(exercise)
    }
  }
  const float inv = flash::softmax_normalizer(stats);
  *reinterpret_cast<uint2*>(o + row * kHeadDim + c) =
      make_uint2(tensor_core::pack2<Element>(acc.x * inv, acc.y * inv),
                 tensor_core::pack2<Element>(acc.z * inv, acc.w * inv));
  if (lse && c == 0) lse[row] = flash::softmax_lse(stats);
}

}  // namespace stage13

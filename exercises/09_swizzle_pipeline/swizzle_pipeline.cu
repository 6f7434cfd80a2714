// Stage 09: swizzle and pipeline.
//
// Stage 08 computes on the tensor cores but feeds them badly, in two ways this stage fixes.
// - Bank conflicts. Shared memory serves a warp from 32 banks of 4 bytes. ldmatrix reads each 8x8
//   matrix as 8 rows of 16 bytes; in stage 08's row-major tile those rows are head_dim * 2 bytes
//   apart, a multiple of 128, so all 8 land in the same 4 banks and are served one after another:
//   8 passes where 1 would do. Padding each row by 16 bytes would fix it at the cost of memory and
//   of 16-byte alignment arithmetic; instead the 16-byte chunk c of row r is stored at chunk
//   c ^ (r % 8). The 8 rows of a matrix then sit in 8 different chunks of the 128-byte bank window,
//   and a full row of chunks is still a permutation of itself, so the 16-byte copies into the tile
//   stay whole. Reads and writes both go through `swizzled`.
// - Waiting for memory. Stage 08 loads a K/V tile, waits, computes, and only then asks for the next
//   one: the tensor cores idle during every load. cp.async copies global to shared memory without
//   passing through registers and without blocking the thread, so the block asks for tile j + 1
//   before it computes on tile j, into a second buffer, and waits for it only when it needs it.
// Everything else, the fragments, the softmax and P in registers, is stage 08's.
#include "swizzle_pipeline.h"

#include "tensor_core.cuh"

namespace stage09 {
namespace {

using tensor_core::cp_async_16;
using tensor_core::cp_async_commit;
using tensor_core::cp_async_wait;
using tensor_core::ldmatrix_x4;
using tensor_core::ldmatrix_x4_trans;
using tensor_core::mma_m16n8k16;
using tensor_core::pack2;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 16;                   // query rows per warp: the M of mma.m16n8k16
constexpr int kBlockRows = kWarps * kWarpRows;  // Br
constexpr int kBlockCols = 64;                  // Bc: keys per K/V tile
constexpr int kMmaK = 16;                       // the K of mma.m16n8k16
constexpr int kMmaN = 8;                        // the N of mma.m16n8k16
constexpr int kKeyBlocks = kBlockCols / kMmaN;  // S accumulators per lane
constexpr int kVecElems = 8;                    // 16-byte vectors of 16-bit elements
constexpr int kStages = 2;                      // K/V buffers: one being computed on, one in flight
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kMinComputeCapability = 80;  // mma.sync with bf16, ldmatrix (sm_80)

template <typename Element, int kHeadDim>
struct SharedTiles {
  Element q[kBlockRows][kHeadDim];
  Element k[kStages][kBlockCols][kHeadDim];
  Element v[kStages][kBlockCols][kHeadDim];
};

// Where element (row, col) of a tile lives: its 16-byte chunk is XORed with the row. Rows of at
// least 128 bytes (head_dim >= 64) use r % 8; 64-byte rows (head_dim 32) put two rows in one bank
// window, so pairs of rows share a pattern and the chunk is XORed with (r / 2) % 4.
template <int kHeadDim>
__device__ int swizzled(int row, int col) {
  constexpr int kChunksPerRow = kHeadDim / kVecElems;
  constexpr int kRowsPerWindow = kChunksPerRow >= 8 ? 1 : 8 / kChunksPerRow;  // rows per 128 bytes
  constexpr int kPatterns = kChunksPerRow >= 8 ? 8 : kChunksPerRow;
  // TODO(exercise): the 16-byte chunk where chunk col / kVecElems of row `row` is stored. It must
  //   be a permutation of the row's chunks (a 16-byte copy stays whole, nothing is overwritten), and
  //   the 8 rows an ldmatrix reads, at one column, must land in 8 different chunks of the 128-byte
  //   bank window: XOR the chunk with a pattern of the row. kRowsPerWindow rows share a window when
  //   a row is shorter than 128 bytes (head_dim 32); kPatterns is how many chunks a window holds.
  //   As shipped every row keeps stage 08's layout: results are right (reads and writes agree) and
  //   every ldmatrix is an 8-way bank conflict, so only the CPU test (ctest -L exercise09) fails.
  //   Lesson: stages/09_swizzle_pipeline/README.md, "What changes from stage 08".
  const int chunk = col / kVecElems;  // placeholder: no swizzle
  (void)kRowsPerWindow;
  (void)kPatterns;
  // END TODO(exercise)
  return chunk * kVecElems + col % kVecElems;
}

// Starts copying rows [first, first + kRows) of a [num_rows, kHeadDim] matrix into a shared tile,
// zeros past num_rows; the caller commits and waits. Coalesced 16-byte reads.
template <int kRows, int kHeadDim, typename Element>
__device__ void load_tile_async(Element (*tile)[kHeadDim], const Element* src, int first, int num_rows) {
  constexpr int kVecsPerRow = kHeadDim / kVecElems;
  for (int e = threadIdx.x; e < kRows * kVecsPerRow; e += kThreads) {
    const int r = e / kVecsPerRow;
    const int c = (e % kVecsPerRow) * kVecElems;
    const bool valid = first + r < num_rows;
    // A row past the end is zero-filled and its source never read; src itself is a valid address.
    const Element* from = valid ? src + static_cast<long long>(first + r) * kHeadDim + c : src;
    cp_async_16(&tile[r][swizzled<kHeadDim>(r, c)], from, valid);
  }
}

// Max and sum over the four lanes t = 0..3 that share a row of an mma accumulator.
__device__ float max_over_row_lanes(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullWarp, x, 2));
}

__device__ float sum_over_row_lanes(float x) {
  x += __shfl_xor_sync(kFullWarp, x, 1);
  return x + __shfl_xor_sync(kFullWarp, x, 2);
}

template <typename Element, int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(kThreads)
    tensor_core_attention_kernel(const Element* q, const Element* k, const Element* v, Element* o, float* lse,
                                 int heads_q, int heads_kv, int seq_q, int seq_kv, float scale, int num_q_tiles) {
  using Tiles = SharedTiles<Element, kHeadDim>;
  constexpr int kDimSteps = kHeadDim / kMmaK;    // k-steps of S = Q K^T
  constexpr int kDimBlocks = kHeadDim / kMmaN;   // O accumulators per lane
  constexpr int kKeySteps = kBlockCols / kMmaK;  // k-steps of O += P V
  extern __shared__ uint4 shared_raw[];
  Tiles& tile = *reinterpret_cast<Tiles*>(shared_raw);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;        // g: the accumulator rows g and g + 8
  const int thread_in_group = lane % 4;  // t: the accumulator columns 2t and 2t + 1
  const int warp_row = warp * kWarpRows;

  const long long bh = blockIdx.x / num_q_tiles;
  const int q_tile = static_cast<int>(blockIdx.x % num_q_tiles);
  const int first_row = (kCausal ? num_q_tiles - 1 - q_tile : q_tile) * kBlockRows;
  const int b = static_cast<int>(bh / heads_q);
  const int h = static_cast<int>(bh % heads_q);
  const long long kv_head = static_cast<long long>(b) * heads_kv + flash::kv_head_of(h, heads_q, heads_kv);
  const Element* k_head = k + kv_head * seq_kv * kHeadDim;
  const Element* v_head = v + kv_head * seq_kv * kHeadDim;

  // Q: shared memory, then A operands. Lane l addresses row l % 16 and column block l / 16 of each
  // 16x16 block, the order ldmatrix.x4 hands out a[0..3].
  // Q and the first K/V tile are requested together; the key loop waits for them.
  load_tile_async<kBlockRows, kHeadDim>(tile.q, q + bh * seq_q * kHeadDim, first_row, seq_q);

  float acc_o[kDimBlocks][4] = {};
  flash::SoftmaxStats stats[2] = {flash::empty_softmax_stats(), flash::empty_softmax_stats()};  // rows g, g + 8

  const int last_row = min(first_row + kBlockRows, seq_q) - 1;
  const int key_end = kCausal ? min(seq_kv, flash::causal_key_end(last_row, seq_q, seq_kv)) : seq_kv;
  const int diagonal = seq_kv - seq_q;  // row i sees keys [0, i + diagonal + 1)
  const int num_tiles = key_end > 0 ? (key_end + kBlockCols - 1) / kBlockCols : 0;
  if (num_tiles > 0) {
    load_tile_async<kBlockCols, kHeadDim>(tile.k[0], k_head, 0, seq_kv);
    load_tile_async<kBlockCols, kHeadDim>(tile.v[0], v_head, 0, seq_kv);
  }
  cp_async_commit();
  uint32_t q_frag[kDimSteps][4];

  for (int j = 0; j < num_tiles; ++j) {
    const int first_key = j * kBlockCols;
    const int buf = j % kStages;
    // Tile j + 1 goes into the other buffer, which every warp finished with at the end of j - 1.
    if (j + 1 < num_tiles) {
      load_tile_async<kBlockCols, kHeadDim>(tile.k[1 - buf], k_head, first_key + kBlockCols, seq_kv);
      load_tile_async<kBlockCols, kHeadDim>(tile.v[1 - buf], v_head, first_key + kBlockCols, seq_kv);
      cp_async_commit();
      cp_async_wait<1>();  // tile j (and Q) landed; tile j + 1 may still be on its way
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // the other threads' copies are visible too
    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < kDimSteps; ++ks) {
        const int r = warp_row + lane % 16;
        ldmatrix_x4(q_frag[ks], &tile.q[r][swizzled<kHeadDim>(r, ks * kMmaK + (lane / 16) * 8)]);
      }
    }

    // S = Q K^T. One ldmatrix.x4 brings the B operands of two 8-key blocks for one k-step: matrix
    // m = lane / 8 is keys [8 * (m / 2), +8) and dims [8 * (m % 2), +8) of the 16x16 block.
    float s[kKeyBlocks][4] = {};
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks)
#pragma unroll
      for (int kb = 0; kb < kKeyBlocks; kb += 2) {
        uint32_t k_frag[4];
        const int r = kb * kMmaN + (lane / 16) * 8 + lane % 8;
        ldmatrix_x4(k_frag, &tile.k[buf][r][swizzled<kHeadDim>(r, ks * kMmaK + ((lane / 8) % 2) * 8)]);
        mma_m16n8k16<Element>(s[kb], q_frag[ks], k_frag[0], k_frag[1]);
        mma_m16n8k16<Element>(s[kb + 1], q_frag[ks], k_frag[2], k_frag[3]);
      }

    // Online softmax on the accumulators: half 0 is row g (s[..][0..1]), half 1 is row g + 8.
    const bool needs_mask =
        first_key + kBlockCols > seq_kv || (kCausal && first_key + kBlockCols > first_row + diagonal + 1);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + warp_row + group + 8 * half;
      const int row_key_end = kCausal ? min(seq_kv, row + diagonal + 1) : seq_kv;
      float tile_max = -INFINITY;
#pragma unroll
      for (int kb = 0; kb < kKeyBlocks; ++kb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& score = s[kb][2 * half + e];
          const int key = first_key + kb * kMmaN + 2 * thread_in_group + e;
          score = needs_mask && key >= row_key_end ? -INFINITY : score * scale;
          tile_max = fmaxf(tile_max, score);
        }
      tile_max = max_over_row_lanes(tile_max);
      float rescale_acc, unused;
      stats[half] = flash::merge_softmax_stats(stats[half], {tile_max, 0.0f}, &rescale_acc, &unused);
      // A row that has seen no key yet has row_max = -inf; exp(-inf - 0) keeps its masked scores at 0.
      const float exp_offset = stats[half].row_max == -INFINITY ? 0.0f : stats[half].row_max;
      float tile_sum = 0.0f;  // this lane's share; the four lanes of the row are summed at the end
#pragma unroll
      for (int kb = 0; kb < kKeyBlocks; ++kb)
#pragma unroll
        for (int e = 0; e < 2; ++e) tile_sum += (s[kb][2 * half + e] = expf(s[kb][2 * half + e] - exp_offset));
      stats[half].row_sum += tile_sum;
#pragma unroll
      for (int db = 0; db < kDimBlocks; ++db) {
        acc_o[db][2 * half] *= rescale_acc;
        acc_o[db][2 * half + 1] *= rescale_acc;
      }
    }

    // O += P V. For keys [16 ks, 16 ks + 16) the A operand is the S accumulators of 8-key blocks
    // 2 ks and 2 ks + 1, rounded to Element: a[0] = row g of the first, a[1] = row g + 8 of the first,
    // a[2] and a[3] the same of the second. One ldmatrix.x4.trans brings the B operands of two
    // 8-dim blocks: matrix m = lane / 8 is keys [8 * (m % 2), +8) and dims [8 * (m / 2), +8).
#pragma unroll
    for (int ks = 0; ks < kKeySteps; ++ks) {
      const uint32_t p_frag[4] = {pack2<Element>(s[2 * ks][0], s[2 * ks][1]),
                                  pack2<Element>(s[2 * ks][2], s[2 * ks][3]),
                                  pack2<Element>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                  pack2<Element>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int db = 0; db < kDimBlocks; db += 2) {
        uint32_t v_frag[4];
        const int r = ks * kMmaK + ((lane / 8) % 2) * 8 + lane % 8;
        ldmatrix_x4_trans(v_frag, &tile.v[buf][r][swizzled<kHeadDim>(r, db * kMmaN + (lane / 16) * 8)]);
        mma_m16n8k16<Element>(acc_o[db], p_frag, v_frag[0], v_frag[1]);
        mma_m16n8k16<Element>(acc_o[db + 1], p_frag, v_frag[2], v_frag[3]);
      }
    }
    __syncthreads();  // every warp is done with buffer buf before tile j + 2 is copied into it
  }
  cp_async_wait<0>();  // a block with no key to visit still has its Q copy in flight

  // Each lane wrote two neighbouring columns of every 8-dim block: one 4-byte store each.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    stats[half].row_sum = sum_over_row_lanes(stats[half].row_sum);
    const int row = first_row + warp_row + group + 8 * half;
    if (row >= seq_q) continue;
    const float normalizer = flash::softmax_normalizer(stats[half]);
    Element* o_row = o + (bh * seq_q + row) * kHeadDim;
#pragma unroll
    for (int db = 0; db < kDimBlocks; ++db)
      *reinterpret_cast<uint32_t*>(o_row + db * kMmaN + 2 * thread_in_group) =
          pack2<Element>(acc_o[db][2 * half] * normalizer, acc_o[db][2 * half + 1] * normalizer);
    if (lse && thread_in_group == 0) lse[bh * seq_q + row] = flash::softmax_lse(stats[half]);
  }
}

template <typename Element, int kHeadDim>
flash::Status launch(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                     int heads_kv, int seq_q, int seq_kv, float scale, bool causal, cudaStream_t stream) {
  const auto kernel = causal ? tensor_core_attention_kernel<Element, kHeadDim, true>
                             : tensor_core_attention_kernel<Element, kHeadDim, false>;
  constexpr size_t kSharedBytes = sizeof(SharedTiles<Element, kHeadDim>);
  flash::Status status = flash::check_shared_memory(kSharedBytes);  // 80 KiB at head_dim 128
  if (status.ok())
    status = flash::allow_shared_memory(kernel, kSharedBytes);
  if (!status.ok()) return status;
  const int num_q_tiles = (seq_q + kBlockRows - 1) / kBlockRows;
  const long long blocks = static_cast<long long>(batch) * heads_q * num_q_tiles;
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSharedBytes, stream>>>(
      static_cast<const Element*>(q), static_cast<const Element*>(k), static_cast<const Element*>(v),
      static_cast<Element*>(o), lse, heads_q, heads_kv, seq_q, seq_kv, scale, num_q_tiles);
  return flash::last_launch_status();
}

template <typename Element>
flash::Status launch_for_head_dim(const void* q, const void* k, const void* v, void* o, float* lse, int batch,
                                  int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                                  bool causal, cudaStream_t stream) {
  switch (head_dim) {
    case 32: return launch<Element, 32>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal, stream);
    case 64: return launch<Element, 64>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal, stream);
    default: return launch<Element, 128>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal, stream);
  }
}

}  // namespace

size_t forward_workspace_size(int, int, int, int, int, int) { return 0; }

flash::Status forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, flash::DType dtype,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  flash::Status status =
      flash::check_forward_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale);
  if (status.ok()) status = flash::check_half_dtype(dtype);
  if (status.ok()) status = flash::check_workspace(workspace, workspace_bytes, 0);
  if (status.ok()) status = flash::check_compute_capability(kMinComputeCapability);
  if (!status.ok()) return status;
  if (dtype == flash::DType::kFp16)
    return launch_for_head_dim<__half>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                       causal, stream);
  return launch_for_head_dim<__nv_bfloat16>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                            causal, stream);
}

}  // namespace stage09

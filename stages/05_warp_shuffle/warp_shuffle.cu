// Stage 05: rows owned by warps, statistics reduced with warp shuffles, tiles held in registers.
//
// Stage 04 is bound by shared memory: its inner loops load two scalars from shared memory for every
// multiply-add, which keeps the shared-memory pipe busy nearly all the time. Its four
// __syncthreads() per K/V tile and its softmax step, in which one thread per row works while the
// rest of the block idles, cost it far less (the lesson's ablation, bench/stage05_ablation.cu,
// switches this stage's changes on one at a time and times each). This stage changes who owns what:
//
// - Each warp owns kWarpRows query rows for the whole kernel. A thread holds a 4 x kKeysPerThread
//   block of scores and a 4 x (head_dim / 8) block of the output in registers, as a
//   register-blocked SGEMM does: every float4 it reads from shared memory feeds four or more
//   multiply-adds, where stage 04 loaded two scalars for each. These register tiles are the change
//   that buys most. They do not make the FMA units the limit: what binds instead (the
//   shared-memory pipe's passes, scheduler cycles with no warp ready to issue, the instructions
//   that are not FFMAs) is measured with Nsight Compute in the lesson, under "What binds now".
// - The eight lanes that share a row (a quarter warp) each hold part of that row's scores. The
//   row max and row sum are finished with three __shfl_xor_sync steps (a butterfly over lane bits
//   0..2): registers to registers, no shared memory and no barrier. Timed as one rung of the
//   ablation this buys next to nothing: the reduction is a small part of each tile's work.
// - The probabilities go to a slice of shared memory private to the warp, so the P V step needs
//   only __syncwarp(). Two block-wide barriers per K/V tile remain: after the tile loads, and
//   before the next tile overwrites it.
//
// Shared memory (floats, d = head_dim, Br = 64 rows, Bc keys per tile, rows padded by 4 floats):
// Q Br*(d+4) + K Bc*(d+4) + V Bc*d + P 4 warps*Bc*16. d = 64, Bc = 64: 66 KiB, three blocks per SM;
// d = 128 with Bc = 64 would need 114 KiB (one block), so d = 128 uses Bc = 32: 74 KiB, three.
// Where the GPU allows a block less (a T4: 64 KiB), Bc is halved until the tiles fit: at d = 64,
// Bc = 32 takes 41.5 KiB; at d = 128, Bc = 16 takes 53.3 KiB and Bc = 8 43.1 KiB.
#include "warp_shuffle.h"

namespace stage05 {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 16;                   // query rows per warp
constexpr int kBlockRows = kWarps * kWarpRows;  // Br
// Lane layout: lane = row_lane * kColLanes + col_lane. The kColLanes lanes with one row_lane share
// the same rows and split the keys (for S) and the output columns (for O) between them.
constexpr int kColLanes = 8;
constexpr int kRowLanes = 32 / kColLanes;
constexpr int kRowsPerThread = kWarpRows / kRowLanes;  // rows row_lane + kRowLanes * i
static_assert(kRowsPerThread == 4, "a thread's rows travel as one float4 of P");
constexpr unsigned kFullWarp = 0xffffffffu;
// Padding of 4 floats per row keeps rows 16-byte aligned for float4 and starts each row 4 banks
// after the previous one, so the eight lanes of a quarter warp, which read eight neighbouring K rows
// at one column, hit all 32 banks once. Unpadded, those float4 reads all fall in the same four banks,
// and the kernel is slower than with scalar loads (stage 05's lesson measures it).
constexpr int kPad = 4;

// Keys per K/V tile (Bc): 64 where three blocks still fit an SM's 228 KiB, 32 at head_dim 128. A GPU
// that allows a block less shared memory gets a smaller Bc (choose_tiles).
template <int kHeadDim>
constexpr int block_cols() {
  return kHeadDim <= 64 ? 64 : 32;
}

template <int kHeadDim, int kBlockCols>
struct SharedTiles {
  static_assert(kBlockCols % kColLanes == 0, "the kColLanes lanes of a row take the same number of keys");
  float q[kBlockRows][kHeadDim + kPad];
  float k[kBlockCols][kHeadDim + kPad];
  float v[kBlockCols][kHeadDim];
  // Each warp's probabilities, transposed: p[warp][key][row_lane * 4 + i] holds row
  // row_lane + kRowLanes * i, so the four rows a thread needs for one key are one float4. Unpadded:
  // the few stores per tile collide in banks, the many loads do not, and the 2 KiB saved per block
  // let three blocks share an SM at head_dim 128.
  float p[kWarps][kBlockCols][kWarpRows];
};

__device__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// Copies rows [first, first + kRows) of a [num_rows, kHeadDim] matrix into a shared tile, zeros
// past num_rows. Coalesced float4 reads and 16-byte stores.
template <int kRows, int kHeadDim, int kStride>
__device__ void load_tile(float (*tile)[kStride], const float* src, int first, int num_rows) {
  constexpr int kVecsPerRow = kHeadDim / 4;
  for (int e = threadIdx.x; e < kRows * kVecsPerRow; e += kThreads) {
    const int r = e / kVecsPerRow;
    const int c = (e % kVecsPerRow) * 4;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (first + r < num_rows) x = load4(src + static_cast<long long>(first + r) * kHeadDim + c);
    *reinterpret_cast<float4*>(&tile[r][c]) = x;
  }
}

// Butterflies over the kColLanes lanes of a row: after log2(kColLanes) exchanges with the lane
// whose index differs in one bit, every lane of the row holds the combined value.
__device__ float max_over_row_lanes(float x) {
#pragma unroll
  for (int offset = kColLanes / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, offset));
  return x;
}

__device__ float sum_over_row_lanes(float x) {
#pragma unroll
  for (int offset = kColLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullWarp, x, offset);
  return x;
}

template <int kHeadDim, int kBlockCols>
__global__ void __launch_bounds__(kThreads)
    warp_shuffle_attention_kernel(const float* q, const float* k, const float* v, float* o, float* lse, int heads_q,
                                  int heads_kv, int seq_q, int seq_kv, float scale, int num_q_tiles) {
  using Tiles = SharedTiles<kHeadDim, kBlockCols>;
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
  const int first_row = static_cast<int>(blockIdx.x % num_q_tiles) * kBlockRows;
  const int b = static_cast<int>(bh / heads_q);
  const int h = static_cast<int>(bh % heads_q);
  const long long kv_head = static_cast<long long>(b) * heads_kv + flash::kv_head_of(h, heads_q, heads_kv);
  const float* k_head = k + kv_head * seq_kv * kHeadDim;
  const float* v_head = v + kv_head * seq_kv * kHeadDim;
  load_tile<kBlockRows, kHeadDim>(tile.q, q + bh * seq_q * kHeadDim, first_row, seq_q);

  float acc_o[kRowsPerThread][kOutVecs * 4] = {};
  flash::SoftmaxStats stats[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) stats[i] = flash::empty_softmax_stats();

  for (int first_key = 0; first_key < seq_kv; first_key += kBlockCols) {
    load_tile<kBlockCols, kHeadDim>(tile.k, k_head, first_key, seq_kv);
    load_tile<kBlockCols, kHeadDim>(tile.v, v_head, first_key, seq_kv);
    __syncthreads();

    // S = Q K^T for this thread's rows and keys: per float4 step, 4 + kKeysPerThread loads feed
    // 16 * kKeysPerThread multiply-adds.
    float s[kRowsPerThread][kKeysPerThread] = {};
#pragma unroll 4
    for (int c = 0; c < kHeadDim; c += 4) {
      float4 q4[kRowsPerThread], k4[kKeysPerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) q4[i] = load4(&tile.q[warp_row + row_lane + kRowLanes * i][c]);
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) k4[j] = load4(&tile.k[col_lane + kColLanes * j][c]);
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kKeysPerThread; ++j)
          s[i][j] += q4[i].x * k4[j].x + q4[i].y * k4[j].y + q4[i].z * k4[j].z + q4[i].w * k4[j].w;
    }

    // Online softmax in registers. Every tile holds at least one real key, so tile_max is finite.
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        s[i][j] = first_key + col_lane + kColLanes * j < seq_kv ? s[i][j] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      tile_max = max_over_row_lanes(tile_max);
      // Merging an empty-sum set with the tile's max yields the new row_max and the factor for
      // what was accumulated against the old one; the tile's own sum is added below.
      float rescale_acc, unused;
      stats[i] = flash::merge_softmax_stats(stats[i], {tile_max, 0.0f}, &rescale_acc, &unused);
      float tile_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) tile_sum += (s[i][j] = expf(s[i][j] - stats[i].row_max));
      stats[i].row_sum += sum_over_row_lanes(tile_sum);
#pragma unroll
      for (int c = 0; c < kOutVecs * 4; ++c) acc_o[i][c] *= rescale_acc;
    }

    // P to this warp's slice of shared memory; only the warp's own lanes read it back.
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j)
      *reinterpret_cast<float4*>(&tile.p[warp][col_lane + kColLanes * j][row_lane * 4]) =
          make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
    __syncwarp();

    // O += P V: per key, one float4 of P and kOutVecs float4s of V feed 16 * kOutVecs multiply-adds.
#pragma unroll 4
    for (int key = 0; key < kBlockCols; ++key) {
      const float4 p4 = load4(&tile.p[warp][key][row_lane * 4]);
      const float p_row[kRowsPerThread] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
      for (int m = 0; m < kOutVecs; ++m) {
        const float4 v4 = load4(&tile.v[key][col_lane * 4 + 32 * m]);
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

// The largest tiles, from kBlockCols down, that fit in `limit` bytes of shared memory per block.
// Bc is halved while the tiles do not fit and take more than the 48 KiB every GPU allows.
template <int kHeadDim, int kBlockCols = block_cols<kHeadDim>()>
flash::Status choose_tiles(size_t limit, flash::TileShape* tiles) {
  constexpr size_t kSharedBytes = sizeof(SharedTiles<kHeadDim, kBlockCols>);
  if (kSharedBytes <= limit) {
    *tiles = {kBlockRows, kBlockCols, kSharedBytes};
    return flash::Status{};
  }
  if constexpr (kSharedBytes > flash::kDefaultSharedMemory)
    return choose_tiles<kHeadDim, kBlockCols / 2>(limit, tiles);
  return flash::shared_memory_status(limit, kSharedBytes);
}

// Launches the kernel compiled for tiles.block_cols (as choose_tiles chose it).
template <int kHeadDim, int kBlockCols = block_cols<kHeadDim>()>
flash::Status launch(const flash::TileShape& tiles, const float* q, const float* k, const float* v, float* o,
                     float* lse, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, float scale,
                     cudaStream_t stream) {
  constexpr size_t kSharedBytes = sizeof(SharedTiles<kHeadDim, kBlockCols>);
  if constexpr (kSharedBytes > flash::kDefaultSharedMemory) {
    if (tiles.block_cols < kBlockCols)
      return launch<kHeadDim, kBlockCols / 2>(tiles, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv,
                                              scale, stream);
  }
  const auto kernel = warp_shuffle_attention_kernel<kHeadDim, kBlockCols>;
  const flash::Status status = flash::allow_shared_memory(kernel, kSharedBytes);
  if (!status.ok()) return status;
  const int num_q_tiles = (seq_q + kBlockRows - 1) / kBlockRows;
  const long long blocks = static_cast<long long>(batch) * heads_q * num_q_tiles;
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSharedBytes, stream>>>(q, k, v, o, lse, heads_q, heads_kv, seq_q,
                                                                             seq_kv, scale, num_q_tiles);
  return flash::last_launch_status();
}

}  // namespace

size_t forward_workspace_size(int, int, int, int, int, int) { return 0; }

flash::Status forward_tiles(int head_dim, size_t shared_limit, flash::TileShape* tiles) {
  if (!flash::supported_head_dim(head_dim))
    return flash::make_status(flash::StatusCode::kHeadDimNotSupported, "head_dim", head_dim);
  switch (head_dim) {
    case 32: return choose_tiles<32>(shared_limit, tiles);
    case 64: return choose_tiles<64>(shared_limit, tiles);
    default: return choose_tiles<128>(shared_limit, tiles);
  }
}

flash::Status forward(const float* q, const float* k, const float* v, float* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream) {
  flash::Status status =
      flash::check_forward_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale);
  if (!status.ok()) return status;
  if (causal) return flash::make_status(flash::StatusCode::kNotSupported, "causal", 1);
  status = flash::check_workspace(workspace, workspace_bytes, 0);
  if (!status.ok()) return status;
  size_t shared_limit = 0;
  flash::TileShape tiles;
  status = flash::shared_memory_limit(&shared_limit);
  if (status.ok()) status = forward_tiles(head_dim, shared_limit, &tiles);
  if (!status.ok()) return status;

  switch (head_dim) {
    case 32: return launch<32>(tiles, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, stream);
    case 64: return launch<64>(tiles, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, stream);
    default: return launch<128>(tiles, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, stream);
  }
}

}  // namespace stage05

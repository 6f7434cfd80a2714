// Stage 04: tiles in shared memory, FlashAttention-2 loop order.
//
// Stage 03 gives every query row its own pass over K and V: for seq_q rows that is seq_q reads of
// every K/V element from global memory (caches catch some of it). Here a block of kBlockRows query
// rows loads each K/V tile of kBlockCols keys into shared memory once, and all its rows use it, so
// K and V are read ceil(seq_q / kBlockRows) times instead of seq_q times. The loop order is
// FlashAttention-2's: the query tile is the outer (parallel) dimension and stays put; K/V tiles
// stream past it, so the output is written once and needs no cross-block rescaling.
//
// Per K/V tile the block takes three steps, each separated by a barrier:
//   1. S = scale * Q K^T for the tile, every thread computing a few scores into shared memory;
//   2. the online-softmax update, one thread per row: the tile's max and sum are merged into the
//      row's running statistics exactly as stage 03 merges one key (flash::merge_softmax_stats);
//   3. O = O * rescale + P V, each thread owning one output column of some rows, in registers.
// Step 2 leaves most threads idle and every step waits on a __syncthreads(); stage 05 removes both.
//
// Shared memory budget (floats, head_dim d, Br = 32 rows, Bc keys per tile): Q tile Br*(d+1), K tile
// Bc*(d+1), V tile Bc*d, scores Br*(Bc+1), plus 2*Br for row factors. With Bc = 32 at d = 128 that is
// 13,472 floats, 52.6 KiB: over the 48 KiB a block gets by default, so the launcher raises the limit
// (an H100 SM has 228 KiB, room for four such blocks). A GPU that allows less per block gets Bc = 16,
// 34.6 KiB, which fits everywhere.
#include "tiled.h"

namespace stage04 {
namespace {

constexpr int kBlockRows = 32;  // Br: query rows per block
// Bc, keys per K/V tile, is a template parameter: 32, or 16 where the GPU's shared memory per block
// is too small for 32 (choose_tiles).
constexpr int kPreferredBlockCols = 32;
constexpr int kThreads = 128;
// One float of padding per row of the Q, K and S tiles. Threads of a warp read different rows at
// the same column; with rows a multiple of 32 words long those reads would all hit one of the 32
// banks and be served one after another.
constexpr int kPad = 1;

template <int kHeadDim, int kBlockCols>
struct SharedTiles {
  float q[kBlockRows][kHeadDim + kPad];
  float k[kBlockCols][kHeadDim + kPad];
  float v[kBlockCols][kHeadDim];
  float s[kBlockRows][kBlockCols + kPad];  // scores, then unnormalized probabilities
  float rescale[kBlockRows];               // exp(old_max - new_max) of this tile, per row
  float normalizer[kBlockRows];            // 1 / row_sum after the last tile
};

// Copies rows [first, first + kRows) of a [num_rows, kHeadDim] matrix into a shared tile, zeros
// past num_rows. Consecutive threads read consecutive 16-byte float4s: coalesced.
template <int kRows, int kHeadDim, int kStride>
__device__ void load_tile(float (*tile)[kStride], const float* src, int first, int num_rows) {
  constexpr int kVecsPerRow = kHeadDim / 4;
  for (int e = threadIdx.x; e < kRows * kVecsPerRow; e += kThreads) {
    const int r = e / kVecsPerRow;
    const int c = (e % kVecsPerRow) * 4;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (first + r < num_rows) x = *reinterpret_cast<const float4*>(src + static_cast<long long>(first + r) * kHeadDim + c);
    tile[r][c] = x.x;
    tile[r][c + 1] = x.y;
    tile[r][c + 2] = x.z;
    tile[r][c + 3] = x.w;
  }
}

template <int kHeadDim, int kBlockCols>
__global__ void __launch_bounds__(kThreads)
    tiled_attention_kernel(const float* q, const float* k, const float* v, float* o, float* lse, int heads_q,
                           int heads_kv, int seq_q, int seq_kv, float scale, int num_q_tiles) {
  extern __shared__ float4 shared_raw[];  // float4: 16-byte alignment for the tiles
  SharedTiles<kHeadDim, kBlockCols>& tile = *reinterpret_cast<SharedTiles<kHeadDim, kBlockCols>*>(shared_raw);

  // Block -> (batch*head, query tile), flattened on grid x so no grid dimension limit applies.
  const long long bh = blockIdx.x / num_q_tiles;
  const int first_row = static_cast<int>(blockIdx.x % num_q_tiles) * kBlockRows;
  const int b = static_cast<int>(bh / heads_q);
  const int h = static_cast<int>(bh % heads_q);
  const long long kv_head = static_cast<long long>(b) * heads_kv + flash::kv_head_of(h, heads_q, heads_kv);
  const float* k_head = k + kv_head * seq_kv * kHeadDim;
  const float* v_head = v + kv_head * seq_kv * kHeadDim;
  load_tile<kBlockRows, kHeadDim>(tile.q, q + bh * seq_q * kHeadDim, first_row, seq_q);

  // Step 1 mapping: kScoreThreadsPerRow threads share a row, each taking every
  // kScoreThreadsPerRow-th key of the tile.
  constexpr int kScoreThreadsPerRow = kThreads / kBlockRows;
  constexpr int kScoresPerThread = kBlockCols / kScoreThreadsPerRow;
  static_assert(kScoresPerThread * kScoreThreadsPerRow == kBlockCols, "the threads of a row share the keys evenly");
  const int score_row = threadIdx.x / kScoreThreadsPerRow;
  const int score_col = threadIdx.x % kScoreThreadsPerRow;

  // Step 3 mapping: thread owns output column out_col of rows out_row, out_row + kRowGroups, ...
  constexpr int kRowGroups = kThreads / kHeadDim;
  constexpr int kRowsPerThread = kBlockRows / kRowGroups;
  const int out_col = threadIdx.x % kHeadDim;
  const int out_row = threadIdx.x / kHeadDim;
  float acc_o[kRowsPerThread] = {};

  // Step 2 state: thread r < kBlockRows keeps row r's running statistics in registers.
  flash::SoftmaxStats stats = flash::empty_softmax_stats();

  for (int first_key = 0; first_key < seq_kv; first_key += kBlockCols) {
    load_tile<kBlockCols, kHeadDim>(tile.k, k_head, first_key, seq_kv);
    load_tile<kBlockCols, kHeadDim>(tile.v, v_head, first_key, seq_kv);
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
    __syncthreads();

    // 2. Online softmax over the tile. Every tile holds at least one real key, so tile_max is finite.
    if (threadIdx.x < kBlockRows) {
      float* s_row = tile.s[threadIdx.x];
      float tile_max = -INFINITY;
      for (int j = 0; j < kBlockCols; ++j) tile_max = fmaxf(tile_max, s_row[j]);
      float tile_sum = 0.0f;
      for (int j = 0; j < kBlockCols; ++j) tile_sum += (s_row[j] = expf(s_row[j] - tile_max));
      float rescale_acc, rescale_tile;
      stats = flash::merge_softmax_stats(stats, {tile_max, tile_sum}, &rescale_acc, &rescale_tile);
      for (int j = 0; j < kBlockCols; ++j) s_row[j] *= rescale_tile;  // now exp(s - new row_max)
      tile.rescale[threadIdx.x] = rescale_acc;
    }
    __syncthreads();

    // 3. O = O * rescale + P V.
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int r = out_row + i * kRowGroups;
      float acc = acc_o[i] * tile.rescale[r];
#pragma unroll 8
      for (int j = 0; j < kBlockCols; ++j) acc += tile.s[r][j] * tile.v[j][out_col];
      acc_o[i] = acc;
    }
    __syncthreads();  // the next tile overwrites k, v and s
  }

  if (threadIdx.x < kBlockRows) {
    tile.normalizer[threadIdx.x] = flash::softmax_normalizer(stats);
    const int row = first_row + threadIdx.x;
    if (lse && row < seq_q) lse[bh * seq_q + row] = flash::softmax_lse(stats);
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = out_row + i * kRowGroups;
    if (first_row + r < seq_q)
      o[(bh * seq_q + first_row + r) * kHeadDim + out_col] = acc_o[i] * tile.normalizer[r];
  }
}

// The largest tiles, from kBlockCols down, that fit in `limit` bytes of shared memory per block.
// Bc is halved while the tiles do not fit and take more than the 48 KiB every GPU allows.
template <int kHeadDim, int kBlockCols = kPreferredBlockCols>
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
template <int kHeadDim, int kBlockCols = kPreferredBlockCols>
flash::Status launch(const flash::TileShape& tiles, const float* q, const float* k, const float* v, float* o,
                     float* lse, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, float scale,
                     cudaStream_t stream) {
  constexpr size_t kSharedBytes = sizeof(SharedTiles<kHeadDim, kBlockCols>);
  if constexpr (kSharedBytes > flash::kDefaultSharedMemory) {
    if (tiles.block_cols < kBlockCols)
      return launch<kHeadDim, kBlockCols / 2>(tiles, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv,
                                              scale, stream);
  }
  const auto kernel = tiled_attention_kernel<kHeadDim, kBlockCols>;
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

}  // namespace stage04

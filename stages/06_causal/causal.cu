// Stage 06: causal masking that skips work instead of hiding it.
//
// With causal = true, query i sees key j only if j <= i + (seq_kv - seq_q) (bottom-right aligned:
// the last query row sees every key). Masking alone, setting the hidden scores to -inf, would give
// the right answer at full cost. The tiles make skipping cheap instead:
// - A block's last row sees keys [0, key_end); every K/V tile at or past key_end lies wholly above
//   the diagonal for the whole block, so the key loop simply stops there. For seq_q = seq_kv that
//   removes almost half of the tiles.
// - Only tiles that cross the diagonal (first_key + Bc past the first row's limit) pay for the
//   per-element comparison; tiles wholly below it run the unmasked loop of stage 05.
// - A row can see no key at all (seq_q > seq_kv): its max stays -inf, and exp(s - row_max) would be
//   exp(-inf + inf) = NaN, so the exponent uses 0 in place of an infinite max. Such rows end with
//   row_sum = 0, which flash::softmax_normalizer and flash::softmax_lse turn into O = 0, lse = -inf.
// - Blocks near the end of the sequence now do more tiles than blocks near the start. Each head's
//   longest blocks are handed out first, so that the short ones fill in the tail. Measured against
//   the natural order (the lesson), this gains little: the blocks of the many heads in flight
//   already mix long and short work, and only the last blocks to start differ between the orders.
// Everything else is stage 05; with causal = false this kernel is stage 05's.
#include "causal.h"

namespace stage06 {
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

template <int kHeadDim, int kBlockCols, bool kCausal>
__global__ void __launch_bounds__(kThreads)
    causal_attention_kernel(const float* q, const float* k, const float* v, float* o, float* lse, int heads_q,
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
  // Causal: a head's last query tiles have the most keys to visit, so they take its lowest block
  // indices and start first.
  const int q_tile = static_cast<int>(blockIdx.x % num_q_tiles);
  const int first_row = (kCausal ? num_q_tiles - 1 - q_tile : q_tile) * kBlockRows;
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

  // Keys any row of this block may see: up to the last row's limit when causal.
  const int last_row = min(first_row + kBlockRows, seq_q) - 1;
  const int key_end = kCausal ? min(seq_kv, flash::causal_key_end(last_row, seq_q, seq_kv)) : seq_kv;
  const int diagonal = seq_kv - seq_q;  // row i sees keys [0, i + diagonal + 1)

  for (int first_key = 0; first_key < key_end; first_key += kBlockCols) {
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

    // Online softmax in registers. A tile that crosses the diagonal masks per element.
    const bool crosses_diagonal = kCausal && first_key + kBlockCols > first_row + diagonal + 1;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = first_row + warp_row + row_lane + kRowLanes * i;
      const int row_key_end = crosses_diagonal ? min(key_end, row + diagonal + 1) : seq_kv;
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        s[i][j] = first_key + col_lane + kColLanes * j < row_key_end ? s[i][j] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      tile_max = max_over_row_lanes(tile_max);
      // Merging an empty-sum set with the tile's max yields the new row_max and the factor for
      // what was accumulated against the old one; the tile's own sum is added below.
      float rescale_acc, unused;
      stats[i] = flash::merge_softmax_stats(stats[i], {tile_max, 0.0f}, &rescale_acc, &unused);
      // A row that has seen no key yet has row_max = -inf; exp(-inf - 0) keeps its masked scores at 0.
      const float exp_offset = stats[i].row_max == -INFINITY ? 0.0f : stats[i].row_max;
      float tile_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) tile_sum += (s[i][j] = expf(s[i][j] - exp_offset));
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
                     float* lse, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, float scale, bool causal,
                     cudaStream_t stream) {
  constexpr size_t kSharedBytes = sizeof(SharedTiles<kHeadDim, kBlockCols>);
  if constexpr (kSharedBytes > flash::kDefaultSharedMemory) {
    if (tiles.block_cols < kBlockCols)
      return launch<kHeadDim, kBlockCols / 2>(tiles, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv,
                                              scale, causal, stream);
  }
  const auto kernel = causal ? causal_attention_kernel<kHeadDim, kBlockCols, true>
                             : causal_attention_kernel<kHeadDim, kBlockCols, false>;
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
  status = flash::check_workspace(workspace, workspace_bytes, 0);
  if (!status.ok()) return status;
  size_t shared_limit = 0;
  flash::TileShape tiles;
  status = flash::shared_memory_limit(&shared_limit);
  if (status.ok()) status = forward_tiles(head_dim, shared_limit, &tiles);
  if (!status.ok()) return status;

  switch (head_dim) {
    case 32: return launch<32>(tiles, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal, stream);
    case 64: return launch<64>(tiles, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal, stream);
    default:
      return launch<128>(tiles, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal, stream);
  }
}

}  // namespace stage06

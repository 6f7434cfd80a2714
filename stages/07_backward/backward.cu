// Stage 07, backward: gradients by recomputation.
//
// With S = scale * Q K^T, P = softmax(S) row by row and O = P V, the gradients of a loss with
// upstream gradient dO are
//   dV = P^T dO,   dP = dO V^T,   dS = P o (dP - D),   dQ = scale * dS K,   dK = scale * dS^T Q,
// where o is the elementwise product and D_i = sum_j P_ij dP_ij. The softmax Jacobian of row i is
// diag(p) - p p^T, so dS_i = p o dP_i - p (p . dP_i): that is where D comes from. Since
// dP_i = dO_i V^T, D_i = sum_j P_ij (dO_i . v_j) = dO_i . (sum_j P_ij v_j) = dO_i . O_i, a dot product
// of two rows we already have: one cheap pass over dO and O instead of a pass over P.
//
// P itself is N^2 per head; storing it would cost 1 GiB per head at seq 16384. Instead the forward
// saved lse_i = log sum_j exp(S_ij), and P_ij = exp(S_ij - lse_i) is recomputed tile by tile from Q
// and K: two extra matrix products bought with O(N) memory and no N^2 traffic.
//
// Three kernels:
//   1. D = rowsum(dO o O), a warp per row.
//   2. dK, dV, parallel over K/V tiles: each block keeps its K_j, V_j and the dK_j, dV_j
//      accumulators on chip and streams every query tile that can see them (all query heads of a
//      GQA group, so the sum over the group needs no atomics).
//   3. dQ, parallel over query tiles, streaming K/V tiles as the forward does.
// Kernels 2 and 3 both recompute S, P, dP and dS (seven tile products instead of five). In return
// every gradient element has exactly one writer and is summed in a fixed order: no atomics, and the
// same inputs give the same bits. The alternative, accumulating dQ with fp32 atomics from kernel 2,
// saves the two products and loses that determinism.
//
// Each product is a small matrix multiply over shared-memory tiles, with the 256 threads of a block
// as a 16 x 16 grid, each owning a (T/16) x (N/16) block of the result in registers, as in stage 05.
//
// Shared memory (floats, d = head_dim, T = query rows = keys per tile, rows padded by 4 floats):
// Q, dO, K, V 4*T*(d+4) + P, dS 2*T*(T+4) + lse, D 2*T. T = 64: 102.5 KiB at d = 64, 166.5 KiB at
// d = 128, which an H100 (227 KiB per block) holds. Where the GPU allows less, T is halved until the
// tiles fit: T = 32 takes 43.3 KiB at d = 64 and 75.3 KiB at d = 128, T = 16 35.6 KiB at d = 128.
#include "backward.h"

namespace stage07 {
namespace {

constexpr int kThreads = 256;
constexpr int kGrid = 16;  // threads as a kGrid x kGrid grid over every output tile
// T, query rows and keys per tile (Br = Bc, so every tile product has T rows and each thread T / kGrid
// of them), is a template parameter: 64, or 32 or 16 where the GPU's shared memory per block is too
// small for 64 (choose_tiles).
constexpr int kPreferredTile = 64;
// Rows padded by 4 floats: float4-aligned, and neighbouring rows start 4 banks apart.
constexpr int kPad = 4;

__device__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
// R adjacent floats (R = 1, 2 or 4) in one load.
template <int R>
__device__ void load_vec(const float* p, float (&out)[R]) {
  if constexpr (R == 4) {
    const float4 x = load4(p);
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w;
  } else if constexpr (R == 2) {
    const float2 x = *reinterpret_cast<const float2*>(p);
    out[0] = x.x, out[1] = x.y;
  } else {
    static_assert(R == 1, "one, two or four floats");
    out[0] = *p;
  }
}
// acc + a . b as four chained FMAs. Written as acc + a.x * b.x + ... the compiler may not reorder
// the sum and emits a multiply, three FMAs and an add (stage 05's exercise 2).
__device__ float fma_dot4(float acc, float4 a, float4 b) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

// The columns a thread owns in a tile N wide: kVec adjacent columns (one vector load), repeated
// every kGrid * kVec columns, so a row of the warp reads one contiguous span.
template <int N>
struct Cols {
  static constexpr int kPerThread = N / kGrid;
  static constexpr int kVec = kPerThread >= 4 ? 4 : kPerThread;
  __device__ static int at(int grid_col, int j) { return (j / kVec) * (kGrid * kVec) + grid_col * kVec + j % kVec; }
  // B[k][cols of this thread] into out[0 .. kPerThread).
  __device__ static void load(const float* row, int grid_col, float* out) {
#pragma unroll
    for (int j = 0; j < kPerThread; j += kVec) {
      const float* p = row + at(grid_col, j);
      if constexpr (kVec == 4) {
        const float4 x = load4(p);
        out[j] = x.x, out[j + 1] = x.y, out[j + 2] = x.z, out[j + 3] = x.w;
      } else {
        const float2 x = *reinterpret_cast<const float2*>(p);
        out[j] = x.x, out[j + 1] = x.y;
      }
    }
  }
};

__device__ int grid_row() { return threadIdx.x / kGrid; }
__device__ int grid_col() { return threadIdx.x % kGrid; }

// acc[i][j] += sum_k A[m][k] B[n][k]   (A B^T)   with m = grid_row + kGrid i, n = grid_col + kGrid j.
// S = Q K^T and dP = dO V^T: both operands read along k, one float4 per row per 4 steps.
template <int K, int R, int TN, int LDA, int LDB>
__device__ void gemm_abt(float (&acc)[R][TN], const float (*a)[LDA], const float (*b)[LDB]) {
#pragma unroll 4
  for (int k = 0; k < K; k += 4) {
    float4 a4[R], b4[TN];
#pragma unroll
    for (int i = 0; i < R; ++i) a4[i] = load4(&a[grid_row() + kGrid * i][k]);
#pragma unroll
    for (int j = 0; j < TN; ++j) b4[j] = load4(&b[grid_col() + kGrid * j][k]);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = fma_dot4(acc[i][j], a4[i], b4[j]);
  }
}

// acc[i][j] += sum_k A[k][m] B[k][n]   (A^T B)   with m = R grid_row + i, n = Cols<N>::at(grid_col, j).
// dV += P^T dO and dK += dS^T Q: per k, R adjacent floats of A (a float4 at T = 64) and the thread's
// columns of B.
template <int K, int N, int R, int LDA, int LDB>
__device__ void gemm_atb(float (&acc)[R][N / kGrid], const float (*a)[LDA], const float (*b)[LDB]) {
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float a_col[R];
    load_vec(&a[k][grid_row() * R], a_col);
    float b_row[N / kGrid];
    Cols<N>::load(b[k], grid_col(), b_row);
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < N / kGrid; ++j) acc[i][j] += a_col[i] * b_row[j];
  }
}

// acc[i][j] += sum_k A[m][k] B[k][n]   (A B)   with m = grid_row + kGrid i, n = Cols<N>::at(grid_col, j).
// dQ += dS K.
template <int K, int N, int R, int LDA, int LDB>
__device__ void gemm_ab(float (&acc)[R][N / kGrid], const float (*a)[LDA], const float (*b)[LDB]) {
#pragma unroll 2
  for (int k = 0; k < K; k += 4) {
    float a_rows[R][4];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float4 x = load4(&a[grid_row() + kGrid * i][k]);
      a_rows[i][0] = x.x, a_rows[i][1] = x.y, a_rows[i][2] = x.z, a_rows[i][3] = x.w;
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      float b_row[N / kGrid];
      Cols<N>::load(b[k + kk], grid_col(), b_row);
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < N / kGrid; ++j) acc[i][j] += a_rows[i][kk] * b_row[j];
    }
  }
}

// Shared memory of kernels 2 and 3: one query tile (Q, dO, lse, D), one key tile (K, V), and the
// recomputed P and dS of the pair. Kernel 3 needs no P and leaves it unused; one layout for both
// keeps the recomputation a single function.
template <int kHeadDim, int kTile>
struct Tiles {
  static_assert(kTile % kGrid == 0 && kTile / kGrid <= 4, "1, 2 or 4 rows of each tile product per thread");
  static constexpr int kBlockRows = kTile;  // Br
  static constexpr int kBlockCols = kTile;  // Bc
  static constexpr int kRowsPerThread = kTile / kGrid;
  float q[kBlockRows][kHeadDim + kPad];
  float d_o[kBlockRows][kHeadDim + kPad];
  float k[kBlockCols][kHeadDim + kPad];
  float v[kBlockCols][kHeadDim + kPad];
  float p[kBlockRows][kBlockCols + kPad];
  float ds[kBlockRows][kBlockCols + kPad];
  float lse[kBlockRows];
  float d[kBlockRows];
};

// Copies rows [first, first + kRows) of a [num_rows, kHeadDim] matrix into a shared tile, zeros
// past num_rows.
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

// lse and D of a query tile. Rows past seq_q get lse = +inf, so their recomputed P is exp(-inf) = 0
// and they contribute nothing.
template <int kHeadDim, int kTile>
__device__ void load_query_tile(Tiles<kHeadDim, kTile>& t, const float* q, const float* d_o, const float* lse,
                                const float* d, long long bh, int first_row, int seq_q) {
  constexpr int kBlockRows = kTile;
  load_tile<kBlockRows, kHeadDim>(t.q, q + bh * seq_q * kHeadDim, first_row, seq_q);
  load_tile<kBlockRows, kHeadDim>(t.d_o, d_o + bh * seq_q * kHeadDim, first_row, seq_q);
  for (int r = threadIdx.x; r < kBlockRows; r += kThreads) {
    const bool real = first_row + r < seq_q;
    t.lse[r] = real ? lse[bh * seq_q + first_row + r] : INFINITY;
    t.d[r] = real ? d[bh * seq_q + first_row + r] : 0.0f;
  }
}

// For the query tile at first_row and the key tile at first_key, both in shared memory:
// P = exp(scale * Q K^T - lse) and dS = P o (dO V^T - D), masked, written to t.p (if kNeedP) and
// t.ds. Hidden keys (past seq_kv, or above the diagonal when causal) get P = 0 before the exp could
// see them, which also covers rows that see no key at all (lse = -inf).
template <int kHeadDim, bool kNeedP, int kTile>
__device__ void recompute_p_and_ds(Tiles<kHeadDim, kTile>& t, float scale, int first_row, int first_key, int seq_kv,
                                   bool causal, int diagonal) {
  constexpr int kRowsPerThread = kTile / kGrid;
  constexpr int kKeysPerThread = kTile / kGrid;
  float s[kRowsPerThread][kKeysPerThread] = {};
  float dp[kRowsPerThread][kKeysPerThread] = {};
  gemm_abt<kHeadDim>(s, t.q, t.k);
  gemm_abt<kHeadDim>(dp, t.d_o, t.v);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = grid_row() + kGrid * i;
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) {
      const int c = grid_col() + kGrid * j;
      const int key = first_key + c;
      const bool visible = key < seq_kv && (!causal || key <= first_row + r + diagonal);
      const float p = visible ? expf(scale * s[i][j] - t.lse[r]) : 0.0f;
      if (kNeedP) t.p[r][c] = p;
      t.ds[r][c] = p * (dp[i][j] - t.d[r]);
    }
  }
}

// 1. D_i = dO_i . O_i, one warp per row, lanes striding over the columns, then a butterfly sum.
__global__ void row_dot_kernel(const float* d_o, const float* o, float* d, long long num_rows, int head_dim) {
  const long long row = (blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= num_rows) return;  // whole warps leave together: num_rows is counted in warps
  float sum = 0.0f;
  for (int c = lane; c < head_dim; c += 32) sum += d_o[row * head_dim + c] * o[row * head_dim + c];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) d[row] = sum;
}

// 2. dK and dV of one key tile of one K/V head.
template <int kHeadDim, int kTile>
__global__ void __launch_bounds__(kThreads)
    dk_dv_kernel(const float* q, const float* k, const float* v, const float* lse, const float* d_o, const float* d,
                 float* dk, float* dv, int heads_q, int heads_kv, int seq_q, int seq_kv, float scale, bool causal,
                 int num_k_tiles) {
  using Shared = Tiles<kHeadDim, kTile>;
  constexpr int kBlockRows = Shared::kBlockRows, kBlockCols = Shared::kBlockCols;
  constexpr int kRowsPerThread = Shared::kRowsPerThread;
  extern __shared__ float4 shared_raw[];
  Shared& t = *reinterpret_cast<Shared*>(shared_raw);
  const long long kv_head = blockIdx.x / num_k_tiles;  // b * heads_kv + h_kv
  const int first_key = static_cast<int>(blockIdx.x % num_k_tiles) * kBlockCols;
  const int group = heads_q / heads_kv;
  const long long first_q_head = (kv_head / heads_kv) * heads_q + (kv_head % heads_kv) * group;
  const int diagonal = seq_kv - seq_q;
  load_tile<kBlockCols, kHeadDim>(t.k, k + kv_head * seq_kv * kHeadDim, first_key, seq_kv);
  load_tile<kBlockCols, kHeadDim>(t.v, v + kv_head * seq_kv * kHeadDim, first_key, seq_kv);

  float dk_acc[kRowsPerThread][kHeadDim / kGrid] = {};
  float dv_acc[kRowsPerThread][kHeadDim / kGrid] = {};
  // Causal: query rows before first_key - diagonal see none of this tile's keys.
  const int first_row_needed = causal ? max(0, first_key - diagonal) : 0;
  for (long long bh = first_q_head; bh < first_q_head + group; ++bh) {
    for (int first_row = first_row_needed / kBlockRows * kBlockRows; first_row < seq_q; first_row += kBlockRows) {
      load_query_tile(t, q, d_o, lse, d, bh, first_row, seq_q);
      __syncthreads();
      recompute_p_and_ds<kHeadDim, true>(t, scale, first_row, first_key, seq_kv, causal, diagonal);
      __syncthreads();
      gemm_atb<kBlockRows, kHeadDim>(dv_acc, t.p, t.d_o);  // dV += P^T dO
      gemm_atb<kBlockRows, kHeadDim>(dk_acc, t.ds, t.q);   // dK += dS^T Q (scaled at the end)
      __syncthreads();
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int key = first_key + grid_row() * kRowsPerThread + i;
    if (key >= seq_kv) continue;
    const long long offset = (kv_head * seq_kv + key) * kHeadDim;
#pragma unroll
    for (int j = 0; j < kHeadDim / kGrid; ++j) {
      const int c = Cols<kHeadDim>::at(grid_col(), j);
      dk[offset + c] = scale * dk_acc[i][j];
      dv[offset + c] = dv_acc[i][j];
    }
  }
}

// 3. dQ of one query tile.
template <int kHeadDim, int kTile>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(const float* q, const float* k, const float* v, const float* lse, const float* d_o, const float* d,
              float* dq, int heads_q, int heads_kv, int seq_q, int seq_kv, float scale, bool causal, int num_q_tiles) {
  using Shared = Tiles<kHeadDim, kTile>;
  constexpr int kBlockRows = Shared::kBlockRows, kBlockCols = Shared::kBlockCols;
  constexpr int kRowsPerThread = Shared::kRowsPerThread;
  extern __shared__ float4 shared_raw[];
  Shared& t = *reinterpret_cast<Shared*>(shared_raw);
  const long long bh = blockIdx.x / num_q_tiles;
  const int q_tile = static_cast<int>(blockIdx.x % num_q_tiles);
  const int first_row = (causal ? num_q_tiles - 1 - q_tile : q_tile) * kBlockRows;  // longest first
  const int b = static_cast<int>(bh / heads_q);
  const long long kv_head = static_cast<long long>(b) * heads_kv + flash::kv_head_of(bh % heads_q, heads_q, heads_kv);
  const int diagonal = seq_kv - seq_q;
  const int last_row = min(first_row + kBlockRows, seq_q) - 1;
  const int key_end = causal ? min(seq_kv, flash::causal_key_end(last_row, seq_q, seq_kv)) : seq_kv;
  load_query_tile(t, q, d_o, lse, d, bh, first_row, seq_q);

  float dq_acc[kRowsPerThread][kHeadDim / kGrid] = {};
  for (int first_key = 0; first_key < key_end; first_key += kBlockCols) {
    load_tile<kBlockCols, kHeadDim>(t.k, k + kv_head * seq_kv * kHeadDim, first_key, seq_kv);
    load_tile<kBlockCols, kHeadDim>(t.v, v + kv_head * seq_kv * kHeadDim, first_key, seq_kv);
    __syncthreads();
    recompute_p_and_ds<kHeadDim, false>(t, scale, first_row, first_key, seq_kv, causal, diagonal);
    __syncthreads();
    gemm_ab<kBlockCols, kHeadDim>(dq_acc, t.ds, t.k);  // dQ += dS K (scaled at the end)
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int row = first_row + grid_row() + kGrid * i;
    if (row >= seq_q) continue;
#pragma unroll
    for (int j = 0; j < kHeadDim / kGrid; ++j)
      dq[(bh * seq_q + row) * kHeadDim + Cols<kHeadDim>::at(grid_col(), j)] = scale * dq_acc[i][j];
  }
}

// The largest tiles, from kTile down, that fit in `limit` bytes of shared memory per block. T is
// halved while the tiles do not fit and take more than the 48 KiB every GPU allows.
template <int kHeadDim, int kTile = kPreferredTile>
flash::Status choose_tiles(size_t limit, flash::TileShape* tiles) {
  constexpr size_t kSharedBytes = sizeof(Tiles<kHeadDim, kTile>);
  if (kSharedBytes <= limit) {
    *tiles = {kTile, kTile, kSharedBytes};
    return flash::Status{};
  }
  if constexpr (kSharedBytes > flash::kDefaultSharedMemory)
    return choose_tiles<kHeadDim, kTile / 2>(limit, tiles);
  return flash::shared_memory_status(limit, kSharedBytes);
}

// Launches kernels 2 and 3 compiled for tiles.block_rows (as choose_tiles chose it).
template <int kHeadDim, int kTile = kPreferredTile>
flash::Status launch(const flash::TileShape& tiles, const float* q, const float* k, const float* v, const float* lse,
                     const float* d_o, const float* d, float* dq, float* dk, float* dv, int batch, int heads_q,
                     int heads_kv, int seq_q, int seq_kv, float scale, bool causal, cudaStream_t stream) {
  constexpr size_t kSharedBytes = sizeof(Tiles<kHeadDim, kTile>);
  if constexpr (kSharedBytes > flash::kDefaultSharedMemory) {
    if (tiles.block_rows < kTile)
      return launch<kHeadDim, kTile / 2>(tiles, q, k, v, lse, d_o, d, dq, dk, dv, batch, heads_q, heads_kv, seq_q,
                                         seq_kv, scale, causal, stream);
  }
  flash::Status status = flash::allow_shared_memory(dk_dv_kernel<kHeadDim, kTile>, kSharedBytes);
  if (status.ok()) status = flash::allow_shared_memory(dq_kernel<kHeadDim, kTile>, kSharedBytes);
  if (!status.ok()) return status;

  const int num_k_tiles = (seq_kv + kTile - 1) / kTile;
  const long long dk_dv_blocks = static_cast<long long>(batch) * heads_kv * num_k_tiles;
  dk_dv_kernel<kHeadDim, kTile><<<static_cast<unsigned>(dk_dv_blocks), kThreads, kSharedBytes, stream>>>(
      q, k, v, lse, d_o, d, dk, dv, heads_q, heads_kv, seq_q, seq_kv, scale, causal, num_k_tiles);
  if (!(status = flash::last_launch_status()).ok()) return status;

  const int num_q_tiles = (seq_q + kTile - 1) / kTile;
  const long long dq_blocks = static_cast<long long>(batch) * heads_q * num_q_tiles;
  dq_kernel<kHeadDim, kTile><<<static_cast<unsigned>(dq_blocks), kThreads, kSharedBytes, stream>>>(
      q, k, v, lse, d_o, d, dq, heads_q, heads_kv, seq_q, seq_kv, scale, causal, num_q_tiles);
  return flash::last_launch_status();
}

}  // namespace

size_t backward_workspace_size(int batch, int heads_q, int /*heads_kv*/, int seq_q, int /*seq_kv*/, int /*head_dim*/) {
  if (batch < 1 || heads_q < 1 || seq_q < 1) return 0;
  return static_cast<size_t>(batch) * heads_q * seq_q * sizeof(float);
}

flash::Status backward_tiles(int head_dim, size_t shared_limit, flash::TileShape* tiles) {
  if (!flash::supported_head_dim(head_dim))
    return flash::make_status(flash::StatusCode::kHeadDimNotSupported, "head_dim", head_dim);
  switch (head_dim) {
    case 32: return choose_tiles<32>(shared_limit, tiles);
    case 64: return choose_tiles<64>(shared_limit, tiles);
    default: return choose_tiles<128>(shared_limit, tiles);
  }
}

flash::Status backward(const float* q, const float* k, const float* v, const float* o, const float* lse,
                       const float* d_o, float* dq, float* dk, float* dv, int batch, int heads_q, int heads_kv,
                       int seq_q, int seq_kv, int head_dim, float scale, bool causal, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
  flash::Status status =
      flash::check_forward_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale);
  if (!status.ok()) return status;
  const struct {
    const float* ptr;
    const char* name;
  } gradients[] = {{lse, "lse"}, {d_o, "d_o"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"}};
  for (const auto& g : gradients) {
    if (!g.ptr) return flash::make_status(flash::StatusCode::kNullPointer, g.name, 0);
    if (!flash::aligned(g.ptr)) return flash::make_status(flash::StatusCode::kMisalignedPointer, g.name, 0);
  }
  status = flash::check_workspace(workspace, workspace_bytes,
                                  backward_workspace_size(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim));
  if (!status.ok()) return status;
  size_t shared_limit = 0;
  flash::TileShape tiles;
  status = flash::shared_memory_limit(&shared_limit);
  if (status.ok()) status = backward_tiles(head_dim, shared_limit, &tiles);
  if (!status.ok()) return status;

  float* d = static_cast<float*>(workspace);
  const long long num_rows = static_cast<long long>(batch) * heads_q * seq_q;
  constexpr int kRowsPerBlock = kThreads / 32;
  row_dot_kernel<<<static_cast<unsigned>((num_rows + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, stream>>>(
      d_o, o, d, num_rows, head_dim);
  if (!(status = flash::last_launch_status()).ok()) return status;

  switch (head_dim) {
    case 32:
      return launch<32>(tiles, q, k, v, lse, d_o, d, dq, dk, dv, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal,
                        stream);
    case 64:
      return launch<64>(tiles, q, k, v, lse, d_o, d, dq, dk, dv, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal,
                        stream);
    default:
      return launch<128>(tiles, q, k, v, lse, d_o, d, dq, dk, dv, batch, heads_q, heads_kv, seq_q, seq_kv, scale,
                         causal, stream);
  }
}

}  // namespace stage07

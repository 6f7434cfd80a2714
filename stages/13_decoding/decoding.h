// Stage 13: split-KV decoding, a few new queries against a long (and paged) KV cache at HBM speed.
// Each (sequence, K/V head) is cut into key ranges that separate blocks read at once; each block
// leaves a partial (o, lse) in an fp32 workspace and a merge kernel combines them with stage 03's
// online-softmax merge. The query heads of one K/V group share every read of K and V.
//
// Tensors are contiguous on the device, q, k, v, o in `dtype` (fp16 or bf16):
//   q, o [batch, heads_q, seq_q, head_dim] with 1 <= seq_q <= kMaxSeqQ;
//   k, v [batch, heads_kv, seq_kv, head_dim]; lse [batch, heads_q, seq_q] in fp32 (may be null).
// head_dim is 64 or 128. Needs compute capability 8.0 or newer.
//
// The paged cache (forward_paged), as serving engines store it: K and V each in num_pages pages of
// page_size keys, k_pages and v_pages [num_pages, page_size, heads_kv, head_dim] (a page holds every
// K/V head of its keys, so appending a token writes one contiguous row); page_table [batch,
// max_pages_per_seq] int32, row b listing sequence b's pages in key order (key j of sequence b is row
// j % page_size of page page_table[b][j / page_size]); cache_lens [batch] int32, the number of keys
// of each sequence, the seq_q new ones included (the new tokens' K and V are in the cache already).
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage13 {

// The most query rows per sequence and head: decoding is one new token, or a few (speculative
// decoding, a short chunk); more rows are prefill, stage 10's work.
constexpr int kMaxSeqQ = 16;
// The smallest page_size the paged entry point takes (a page_size is a power of two): every 16-key
// slice a warp computes on then lies in one page.
constexpr int kMinPageSize = 16;
// The largest page_size the paged entry point takes.
constexpr int kMaxPageSize = 1 << 16;

// ---------------------------------------------------------------------------------------------
// The split plan (host functions, no GPU needed)
// ---------------------------------------------------------------------------------------------

// Query rows one block holds: one 16-row tile of the tensor cores' m16n8k16. The rows of one K/V
// group (heads_q / heads_kv heads times seq_q queries) are cut into tiles of this many.
constexpr int kBlockRows = 16;
// Keys per block and pipeline step: four warps of 16 keys each.
constexpr int kBlockKeys = 64;
// A split holds at least this many keys (4 steps), so that a block's fixed cost (Q, the pipeline's
// first loads, its partial result) stays small against its reads.
constexpr int kMinSplitKeys = 256;
// At most this many splits of one (sequence, K/V head, row tile).
constexpr int kMaxSplits = 256;
// Splitting never takes the grid past this many blocks: about eight waves of an H100's 132 SMs. The
// heuristic aims at one or two waves, so it stays under this on any GPU with up to 512 SMs; the bound
// keeps the workspace independent of the GPU.
constexpr int kMaxSplitBlocks = 1024;
// A block's fixed cost in the heuristic's time model, in steps of kBlockKeys keys: its first loads'
// latency, the merge of its warps, its partial and that partial's share of merge_kernel. Fitted on
// the H100 to forced split counts (bench/results/h100_stage13_splits.txt, batch 1, 131072 keys):
// 1024 blocks of 16 steps take 1.13x the time of 128 blocks of 128 steps, and 8 (16 + c) / (128 + c)
// = 1.13 gives c = 2.4; 512 blocks of 32 steps (1.058x) give 2.5 and 256 blocks of 64 steps (1.029x)
// 3.8: c = 3, the middle fit rounded up.
constexpr int kBlockOverheadSteps = 3;

// 16-row tiles of one K/V group's heads_q / heads_kv * seq_q query rows.
int row_tiles(int heads_q, int heads_kv, int seq_q);

// The most splits a call of these sizes may use, whatever the GPU: 1 (no split, no workspace) when
// batch * heads_kv * row_tiles already reaches kMaxSplitBlocks, else
// min(kMaxSplits, ceil(seq_kv / kMinSplitKeys), kMaxSplitBlocks / (batch * heads_kv * row_tiles)),
// and at least 1. The workspace is sized for this many.
int max_splits(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv);

// The number of splits forward uses on a GPU with num_sms SMs: the s in [1, max_splits] that
// minimizes the time model
//     waves(s) * (ceil(steps / s) + kBlockOverheadSteps),   waves(s) = ceil(units * s / num_sms),
// units = batch * heads_kv * row_tiles (independent pieces of work), steps = ceil(seq_kv /
// kBlockKeys) (the pipeline steps of one unsplit unit); the smallest such s on a tie. A wave is one
// block per SM: a second block resident on an SM shares that SM's bandwidth (measured, lesson 13), so
// it counts as a second wave. Splitting fills the GPU and shortens each block; the last wave may run
// half empty, and every split pays the block's fixed cost again. The lesson works it through.
int choose_splits(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int num_sms);

// ---------------------------------------------------------------------------------------------
// Contiguous K/V
// ---------------------------------------------------------------------------------------------

// The fp32 workspace of the partial results: 0 when max_splits(...) is 1 (no split: the one block
// per unit writes o and lse itself), else exactly
//     max_splits(...) * batch * heads_q * seq_q * (head_dim + 1) * sizeof(float)
// bytes: per split and query row, the partial o (head_dim floats) and its lse (one float).
size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// O = softmax(scale * Q K^T) V, and each row's log-sum-exp into lse when it is not null; scale is
// usually 1 / sqrt(head_dim). causal = true applies the bottom-right aligned mask
// (flash::causal_key_end): query i of seq_q sees the keys before seq_kv - seq_q + i + 1, the cache
// and the new queries before it; a row that sees no key gets O = 0 and lse = -inf. dtype is kFp16 or
// kBf16. seq_q above kMaxSeqQ and head_dim other than 64 and 128 are refused (kNotSupported,
// kHeadDimNotSupported), like every bad argument, before any launch. Deterministic: the partials are
// merged in split order. On success the work is queued on stream, not finished.
flash::Status forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, flash::DType dtype,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream);

// forward with the number of splits given, not chosen: 1 <= num_splits <= max_splits(...), else
// kInvalidArgument naming num_splits, before any launch. For measuring the split plan
// (bench/stage13_splits.cu, lesson 13) and for the lesson's exercises.
flash::Status forward_with_splits(int num_splits, const void* q, const void* k, const void* v, void* o, float* lse,
                                  int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim,
                                  float scale, bool causal, flash::DType dtype, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Paged K/V (layout at the top of this file)
// ---------------------------------------------------------------------------------------------

// forward_workspace_size for a cache of max_pages_per_seq * page_size keys per sequence: the splits
// are planned for that capacity, and each sequence shares its own length among them.
size_t forward_paged_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int head_dim, int page_size,
                                    int max_pages_per_seq);

// forward over a paged cache with a length per sequence: sequence b has cache_lens[b] keys (0: its
// rows see no key, O = 0, lse = -inf), causal aligns its queries to its own last key. The host
// checks what it can see (pointers, sizes, page_size a power of two from kMinPageSize to
// kMaxPageSize, max_pages_per_seq * page_size within the index range, num_pages >= 1); the contents
// of page_table and cache_lens live on the device and are not read by the host. The kernel never
// reads outside the pages: a length is clamped to [0, max_pages_per_seq * page_size], and a key
// whose page-table entry is outside [0, num_pages) is not read (it counts as a key of zeros, so a
// bad table gives a wrong result, never a fault).
flash::Status forward_paged(const void* q, const void* k_pages, const void* v_pages, const int* page_table,
                            const int* cache_lens, void* o, float* lse, int batch, int heads_q, int heads_kv,
                            int seq_q, int head_dim, int page_size, int num_pages, int max_pages_per_seq, float scale,
                            bool causal, flash::DType dtype, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream);

}  // namespace stage13

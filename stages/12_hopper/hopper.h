// Stage 12: Hopper. The FlashAttention forward on the instructions that only compute capability 9.0
// has: wgmma (asynchronous warpgroup matrix multiply from shared memory), TMA (cp.async.bulk.tensor
// with mbarrier transaction counts), a producer warp that loads while consumer warpgroups compute,
// and register reallocation between them (setmaxnreg). Tensors are contiguous on the device,
// q, k, v, o in `dtype` (fp16 or bf16):
// q, o [batch, heads_q, seq_q, head_dim]; k, v [batch, heads_kv, seq_kv, head_dim];
// lse [batch, heads_q, seq_q] in fp32 (may be null). head_dim 64 or 128. Needs compute capability
// 9.0 exactly and a build that includes sm_90a code (CMAKE_CUDA_ARCHITECTURES with 90).
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage12 {

// 0: scores live in registers.
size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);

// Whether this build and this GPU can run the stage: success, or kArchNotSupported naming the GPU
// (any GPU but compute capability 9.0, or a build without sm_90a code, whatever the GPU), or the CUDA
// error that kept it from asking. forward() calls it after its argument checks.
flash::Status check_gpu();

// The kernel configurations the lesson measures, each adding one piece to the one before it
// (hopper_kernel.cuh, HopperConfig). kRegistered is the one forward() runs: kRegisteredVariant.
enum class Variant : int {
  kRegistered = 0,
  kOneConsumer,    // version A: one consumer warpgroup (64 query rows) and a producer warp, in order
  kTwoConsumers,   // two consumer warpgroups (128 rows) share each K/V tile
  kRegisterSplit,  // the producer is a warpgroup that gives its registers to the consumers (setmaxnreg)
  kPingPong,       // the two consumers take turns on the tensor cores (named barriers)
  kIntraOverlap,   // version B: and each overlaps its softmax with its previous P V product
  kTmaStore,       // version B writing O through shared memory with a TMA store
  kPersistent,     // one block per SM taking work tiles in turn, with two Q buffers
  kTilePairs,      // causal, with more heads than half the SMs, query tiles in pairs, head by head
  kBackToBack,     // the consumers' turns and O's store carry over from one work tile to the next
  kStoreBehindScores,  // O is stored while the next work tile's first scores run
  kLeftoverUnmasked,   // a tile left over after the loop's pairs runs unmasked where none needs the mask
  kWideKeyTiles,       // K/V tiles of 160 keys at head_dim 64 on long sequences
  kSinglesAfterPairs,  // causal pairs: about a pass of them, in whole heads, as single tiles at the end
  kPairsAtAnyHeadCount,  // those pairs and single tiles at any head count
  kVersionAAtHeadDim64,  // the last: version A's kernel at head_dim 64 without the mask, the pairs elsewhere
};
// How many Variant values there are, kRegistered included.
constexpr int kVariantCount = 16;
// The configuration forward() runs: the last variant (every piece, and version A's kernel where it wins).
constexpr Variant kRegisteredVariant = Variant::kVersionAAtHeadDim64;

// "A: 1 consumer warpgroup, in order", ...: how the lesson's table names a variant.
const char* variant_name(Variant variant);

// forward() with one of the variants; the same checks, the same result up to rounding.
flash::Status forward_variant(Variant variant, const void* q, const void* k, const void* v, void* o, float* lse,
                              int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                              bool causal, flash::DType dtype, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream);

// O = softmax(scale * Q K^T) V, and each row's log-sum-exp into lse when it is not null; scale is
// usually 1 / sqrt(head_dim). causal = true applies the bottom-right aligned mask
// (flash::causal_key_end); a row that sees no key gets O = 0 and lse = -inf. dtype is kFp16 or
// kBf16 (anything else: kDtypeNotSupported); head_dim 64 or 128 (anything else:
// kHeadDimNotSupported). workspace may be null (forward_workspace_size is 0). Every check runs
// before any launch; a failed status names the bad argument. On success the work is queued on
// stream, not finished.
flash::Status forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, flash::DType dtype,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace stage12

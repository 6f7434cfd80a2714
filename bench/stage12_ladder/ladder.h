// Stage 12's ladder: the kernel configurations docs/experiments/stage12.md measures, from one consumer
// warpgroup in order to the configuration the registered stage runs, each adding one piece to the one
// before it (ladder_kernel.cuh, HopperConfig). bench/stage12_variants.cu times them side by side and
// checks them (--check). The same arguments, checks and result as stage12::forward (hopper.h), up to
// rounding; the last rung gives stage12::forward's result bit for bit. Compiled for sm_90a when the
// build has 90 in CMAKE_CUDA_ARCHITECTURES (FLASH_STAGE12_SM90A), else a stub that refuses every call.
#pragma once

#include <cstddef>

#include "flash_stage.cuh"

namespace stage12_ladder {

// The rungs. kRegistered launches stage12::forward, the stage itself; the others launch this
// ladder's own kernels.
enum class Variant : int {
  kRegistered = 0,
  kOneConsumer,    // one consumer warpgroup (64 query rows) and a producer warp, in order
  kTwoConsumers,   // two consumer warpgroups (128 rows) share each K/V tile
  kRegisterSplit,  // the producer is a warpgroup that gives its registers to the consumers (setmaxnreg)
  kPingPong,       // the two consumers take turns on the tensor cores (named barriers)
  kIntraOverlap,   // and each overlaps its softmax with its previous P V product
  kTmaStore,       // O written through shared memory with a TMA store
  kPersistent,     // one block per SM taking work tiles in turn, with two Q buffers
  kTilePairs,      // causal, with more heads than half the SMs, query tiles in pairs, head by head
  kBackToBack,     // the consumers' turns and O's store carry over from one work tile to the next
  kStoreBehindScores,  // O is stored while the next work tile's first scores run
  kLeftoverUnmasked,   // a tile left over after the loop's pairs runs unmasked where none needs the mask
  kWideKeyTiles,       // K/V tiles of 160 keys at head_dim 64 on long sequences
  kSinglesAfterPairs,  // causal pairs: about a pass of them, in whole heads, as single tiles at the end
  kPairsAtAnyHeadCount,  // those pairs and single tiles at any head count
  kInOrderAtHeadDim64,   // the last: the in-order kernel at head_dim 64 without the mask, the pairs elsewhere
};
// How many Variant values there are, kRegistered included.
constexpr int kVariantCount = 16;
// The last rung: the configuration stage12::forward runs, written here with its switches.
constexpr Variant kLastVariant = Variant::kInOrderAtHeadDim64;

// "1 consumer warpgroup, in order", ...: how the tables name a rung.
const char* variant_name(Variant variant);

// stage12::forward with one of the rungs; the same checks, the same result up to rounding.
flash::Status forward_variant(Variant variant, const void* q, const void* k, const void* v, void* o, float* lse,
                              int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                              bool causal, flash::DType dtype, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream);

}  // namespace stage12_ladder

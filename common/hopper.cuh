// hopper.cuh: the inline-PTX wrappers that stage 12 names in its lesson, for the instructions only
// compute capability 9.0 has. Like tensor_core.cuh, each wrapper is one PTX instruction (or a spin
// on one), so that the stage reads as the algorithm and this file as the instruction set. Every
// wrapper cites the section of the PTX ISA it follows by the name of its anchor on the page
// https://docs.nvidia.com/cuda/parallel-thread-execution/ (the page's address, '#', the name: the
// numbers of the sections change between PTX versions, the anchors do not); this file was written
// against PTX ISA 9.0 (CUDA 13.0).
//
// Two targets are involved:
// - sm_90 (any compute capability 9.0 build): the tensor memory accelerator (cp.async.bulk.tensor),
//   mbarrier transaction counts, fence.proxy.async;
// - sm_90a, the architecture-specific target ("Target ISA notes: requires sm_90a"): wgmma and
//   setmaxnreg. nvcc defines __CUDA_ARCH_FEAT_SM90_ALL when it compiles device code for sm_90a.
// Outside those targets every wrapper compiles to nothing, so that a stub build of stage 12 (and
// CI's sm_75 check) still compiles this header; the stage refuses such a GPU before any launch.
//
// The words used below:
// - a warpgroup is 4 consecutive warps, the first of which has a warp index divisible by 4
//   (asynchronous-warpgroup-level-matrix-instructions-warpgroup): 128 threads that issue one wgmma;
// - the generic proxy is the path ordinary loads and stores take to memory; the async proxy is the
//   path of the copy engine (TMA) and of wgmma's operand reads (proxies in the memory consistency
//   model). Writes through one proxy are seen by the other only after a proxy fence.
#pragma once

#include <cuda.h>  // CUtensorMap: the 128-byte TMA descriptor (types only; no driver call here)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "tensor_core.cuh"

/// \cond HOPPER_INTERNAL
// FLASH_HOPPER_SM90 / FLASH_HOPPER_SM90A: 1 while nvcc compiles device code for those targets.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FLASH_HOPPER_SM90 1
#else
#define FLASH_HOPPER_SM90 0
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASH_HOPPER_SM90A 1
#else
#define FLASH_HOPPER_SM90A 0
#endif
/// \endcond

namespace hopper {

// The address of a shared-memory object as the 32-bit shared-window offset the .shared::cta
// instructions take.
__device__ inline uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// =============================================================================================
// mbarrier: a 64-bit object in shared memory that counts arrivals and, since sm_90, bytes
// (parallel-synchronization-and-communication-instructions-mbarrier). A phase completes when the
// expected number of threads has arrived AND the transaction count (bytes announced by
// expect_tx, minus bytes the copy engine has delivered) is back to zero; the barrier then starts
// the next phase. Waiters name the phase they wait for by its parity (0, 1, 0, 1, ...).
// =============================================================================================

// mbarrier.init (parallel-synchronization-and-communication-instructions-mbarrier-init): the
// barrier starts in phase 0, expecting `count` arrivals per phase.
__device__ inline void mbarrier_init(uint64_t* bar, uint32_t count) {
#if FLASH_HOPPER_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count) : "memory");
#endif
}

// Makes the mbarrier.init above visible to the other threads and to the copy engine before they
// use the barrier: fence.mbarrier_init.release.cluster (parallel-synchronization-and-communication-
// instructions-membar, the lightweight fence for mbarrier.init), then fence.proxy.async.shared::cta
// (the init was a generic-proxy write; the copy engine updates the barrier through the async proxy;
// the CUDA programming guide's TMA example fences the same way). A __syncthreads() must follow.
__device__ inline void fence_barrier_init() {
#if FLASH_HOPPER_SM90
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// mbarrier.arrive.expect_tx (parallel-synchronization-and-communication-instructions-mbarrier-
// expect-tx, -mbarrier-arrive): announces `bytes` more bytes for the current phase, then arrives
// once. The producer calls it just before it issues the copies that deliver those bytes. Default
// semantics .release at .cta scope.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if FLASH_HOPPER_SM90
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#endif
}

// mbarrier.arrive (parallel-synchronization-and-communication-instructions-mbarrier-arrive): one
// arrival, with release semantics at .cta scope: what this thread did before (for a consumer: its
// reads of a shared-memory buffer, completed) happens before the phase completes.
__device__ inline void mbarrier_arrive(uint64_t* bar) {
#if FLASH_HOPPER_SM90
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
#endif
}

// mbarrier.try_wait.parity (parallel-synchronization-and-communication-instructions-mbarrier-test-
// wait-try-wait): true once the phase of parity `parity` has completed. try_wait may suspend the
// thread for a time the hardware chooses before it answers false; acquire semantics at .cta scope,
// so that the bytes the copy engine delivered in that phase are visible after a true answer.
// Parity, for a barrier that has completed n phases: parity (n & 1) is the phase in progress, which
// has not completed; parity ((n & 1) ^ 1) is taken as the phase just completed, so on a fresh
// barrier (n = 0) a wait for parity 1 returns at once. The producer relies on that for its first
// pass over the ring, when every buffer is empty.
__device__ inline bool mbarrier_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 1;
#if FLASH_HOPPER_SM90
  asm volatile(
      "{\n"
      ".reg .pred ready;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
      "selp.u32 %0, 1, 0, ready;\n"
      "}\n"
      : "=r"(done)
      : "r"(shared_address(bar)), "r"(parity)
      : "memory");
#endif
  return done != 0;
}

// Spins until the phase of parity `parity` of `bar` has completed.
__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

// =============================================================================================
// The tensor memory accelerator (TMA): one thread hands the copy engine a tensor map (made on the
// host by cuTensorMapEncodeTiled: the tensor's address, sizes and strides, the box to copy, the
// shared-memory swizzle) and the coordinates of a box; the engine copies the box into shared
// memory and reports the bytes to an mbarrier (complete_tx). Elements of the box outside the
// tensor are filled with zeros (CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) and still count as bytes.
// =============================================================================================

// cp.async.bulk.tensor.2d/.3d, global to shared, tile mode, completion on an mbarrier
// (data-movement-and-conversion-instructions-cp-async-bulk-tensor). `map` must be the address of
// a __grid_constant__ kernel parameter (or of global/const memory holding the map); coordinates
// are in elements, innermost dimension first, and may lie partly or wholly outside the tensor.
// The destination is written as .shared::cluster, the state space PTX 8.0 defines for it; a CTA's
// own shared::cta address is a valid shared::cluster address of itself.
__device__ inline void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
#if FLASH_HOPPER_SM90
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(shared_address(bar))
      : "memory");
#endif
}

// The same in three dimensions (stage 12's maps: head_dim, sequence, batch x heads).
__device__ inline void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
#if FLASH_HOPPER_SM90
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(shared_address(bar))
      : "memory");
#endif
}

// The other direction, shared to global (the same section: .global.shared::cta, completion in bulk
// groups): the engine reads the box from shared memory and writes the elements that lie inside the
// tensor; those outside it are not written. Completion is tracked per issuing thread in bulk groups,
// as for stage 11's bulk copies (tensor_core.cuh): bulk_commit, then bulk_wait_read before the
// shared memory is written again or the block exits.
__device__ inline void tma_store_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
#if FLASH_HOPPER_SM90
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(shared_address(src))
      : "memory");
#endif
}
using tensor_core::bulk_commit;
using tensor_core::bulk_wait;
using tensor_core::bulk_wait_read;

// cp.async.bulk, global to shared, completion on an mbarrier (data-movement-and-conversion-
// instructions-cp-async-bulk): a plain copy of `bytes` contiguous bytes (a multiple of 16, both
// addresses 16-byte aligned), no tensor map; the bytes count on the barrier as a TMA load's do.
// Stage 14 loads a query tile's lse and D with it, beside the tile's TMA boxes.
__device__ inline void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if FLASH_HOPPER_SM90
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
#endif
}

// fence.proxy.async.shared::cta (parallel-synchronization-and-communication-instructions-membar),
// from tensor_core.cuh, where stage 11's bulk copies need it first: orders this thread's
// generic-proxy accesses to shared memory before its later async-proxy ones (and the other way).
// Needed where ordinary stores write shared memory that wgmma or the copy engine reads next; not
// needed between a TMA write and a wgmma read (both async proxy, ordered by the mbarrier).
using tensor_core::fence_proxy_async_shared;

// =============================================================================================
// A counter in global memory, for blocks that take turns (stage 14's deterministic mode): one block
// waits with acquire loads until the counter says its turn has come, another counts its turn done
// with a release reduction (memory-consistency-model; parallel-synchronization-and-communication-
// instructions-ld, -red). Where the work that the count orders is the copy engine's (a bulk
// reduction, async proxy), fence.proxy.async.global orders it against the counter's generic-proxy
// accesses (parallel-synchronization-and-communication-instructions-membar).
// =============================================================================================

// ld.acquire.gpu.global.b32: the counter, and every write released before it reached this value.
__device__ inline int load_acquire_gpu(const int* counter) {
  int value = 0;
#if FLASH_HOPPER_SM90
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(counter) : "memory");
#endif
  return value;
}

// red.release.gpu.global.add.s32 kValue: adds to the counter after every earlier write of this thread.
template <int kValue>
__device__ inline void red_release_add_gpu(int* counter) {
#if FLASH_HOPPER_SM90
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(counter), "n"(kValue) : "memory");
#endif
}

// fence.proxy.async.global: orders this thread's generic-proxy accesses to global memory with its
// async-proxy ones (the bulk copies), both ways.
__device__ inline void fence_proxy_async_global() {
#if FLASH_HOPPER_SM90
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// =============================================================================================
// Named barriers (parallel-synchronization-and-communication-instructions-bar-barrier): 16 per
// CTA, ids 0 to 15; id 0 is the one __syncthreads() uses. bar.sync waits until kThreads threads
// (a multiple of 32) have arrived at barrier kId, counting itself; bar.arrive counts itself and
// goes on. Two warpgroups take turns with them: one syncs, the other arrives. The id and the count
// are immediates: with a register for the id, ptxas cannot tell which barriers a kernel uses and
// reserves all 16 ("used 16 barriers" in -Xptxas -v).
// =============================================================================================

// bar.sync kId, kThreads: wait until kThreads threads, this one included, have arrived at barrier kId.
template <int kId, int kThreads>
__device__ inline void named_barrier_sync() {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "ids 1 to 15 (0 is __syncthreads'), whole warps");
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// bar.arrive kId, kThreads: count this thread at barrier kId and go on without waiting.
template <int kId, int kThreads>
__device__ inline void named_barrier_arrive() {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "ids 1 to 15 (0 is __syncthreads'), whole warps");
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// =============================================================================================
// Register reallocation (miscellaneous-instructions-setmaxnreg, sm_90a): a warpgroup gives
// registers back to the CTA's pool (dec) or takes more from it (inc, which blocks until the pool
// has them). All 4 warps of the warpgroup must execute the same instruction; the count is 24 to
// 256, a multiple of 8; it takes effect only in a kernel compiled with a register cap
// (__launch_bounds__(threads, 1)). New registers start undefined.
// =============================================================================================

// setmaxnreg.inc.sync.aligned.u32 kRegisters: this warpgroup's threads take registers from the
// block's pool until each owns kRegisters; blocks until the pool has them.
template <int kRegisters>
__device__ inline void setmaxnreg_inc() {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0, "setmaxnreg: 24 to 256, multiple of 8");
#if FLASH_HOPPER_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}

// setmaxnreg.dec.sync.aligned.u32 kRegisters: this warpgroup's threads give registers back to the
// block's pool, down to kRegisters each.
template <int kRegisters>
__device__ inline void setmaxnreg_dec() {
  static_assert(kRegisters >= 24 && kRegisters <= 256 && kRegisters % 8 == 0, "setmaxnreg: 24 to 256, multiple of 8");
#if FLASH_HOPPER_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}

// =============================================================================================
// wgmma: warpgroup matrix multiply-accumulate, asynchronous (asynchronous-warpgroup-level-matrix-
// instructions, sm_90a). D (64 x N, fp32, in the registers of the 128 threads) += A (64 x 16) *
// B (16 x N). B is always read from shared memory, through a matrix descriptor; A from shared
// memory (descriptor) or from registers. The instruction only issues the work: results may be
// read after wgmma.commit_group and wgmma.wait_group, and the registers it reads or writes must
// not be touched in between.
//
// Register fragments (asynchronous-warpgroup-level-matrix-register-fragment-wgmma-64n16). Warp w of
// the warpgroup owns rows 16w to 16w + 15 of D and of A; inside a warp, with g = lane / 4 and
// t = lane % 4, exactly as mma.sync.m16n8k16 (tensor_core.cuh):
//   D: d[4i + 0], d[4i + 1] = D[16w + g][8i + 2t], D[16w + g][8i + 2t + 1]
//      d[4i + 2], d[4i + 3] = D[16w + g + 8][8i + 2t], D[16w + g + 8][8i + 2t + 1]    (i < N / 8)
//   A: a[0] = A[16w + g][2t, 2t + 1]    a[1] = A[16w + g + 8][2t, 2t + 1]
//      a[2] = A[16w + g][2t + 8, 2t + 9] a[3] = A[16w + g + 8][2t + 8, 2t + 9]  (two 16-bit halves, low first)
// So S's accumulators become P's A operand without leaving the thread, as in stages 08-10.
// =============================================================================================

// wgmma.fence (asynchronous-warpgroup-level-matrix-instructions-wgmma-fence): orders this
// warpgroup's earlier register accesses (and shared-memory accesses) before the wgmma.mma_async
// that follow. Required before the first wgmma of a batch whose accumulators or A registers were
// written by ordinary instructions (the softmax rescaling O, P written from S).
__device__ inline void wgmma_fence() {
#if FLASH_HOPPER_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

// wgmma.commit_group (asynchronous-warpgroup-level-matrix-instructions-wgmma-commit-group): closes
// the group of wgmma.mma_async issued since the last commit.
__device__ inline void wgmma_commit_group() {
#if FLASH_HOPPER_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// wgmma.wait_group N (asynchronous-warpgroup-level-matrix-instructions-wgmma-wait-group): waits
// until at most kPending of this thread's committed groups are unfinished; groups finish in the
// order they were committed. After it, the accumulators of the finished groups may be read and
// their shared-memory operands overwritten.
template <int kPending>
__device__ inline void wgmma_wait_group() {
#if FLASH_HOPPER_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Keeps the compiler from moving reads or writes of registers a wgmma is still using to before the
// wgmma.wait_group above it: an empty asm that claims to read and write each of them. asm volatile
// statements keep their order, so every use of x after this stays after the wait.
template <int kCount>
__device__ inline void fence_registers(float (&x)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(x[i])::"memory");
}

// The same for a register A operand: kCount fragments of 4 registers.
template <int kCount>
__device__ inline void fence_registers(uint32_t (&x)[kCount][4]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(x[i][e])::"memory");
}

// The shared-memory matrix descriptor (asynchronous-warpgroup-level-matrix-shared-memory-layout-
// matrix-descriptor), 64 bits:
//   bits  0-13: start address >> 4            (matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4)
//   bits 16-29: leading dimension byte offset >> 4
//   bits 32-45: stride dimension byte offset >> 4
//   bits 49-51: matrix base offset: 0 when the swizzle pattern starts on its repeat boundary
//               (1024 bytes for the 128-byte swizzle), which every tile of stage 12 does
//   bits 62-63: swizzle mode: 0 none, 1 128-byte, 2 64-byte, 3 32-byte.
// Only the 128-byte swizzle is used here (kSwizzle128B); its layout, for 16-bit elements
// (asynchronous-warpgroup-level-canonical-layouts, with T = 8 elements = 16 bytes):
//   K-major  (each row's K elements contiguous; Q and K, both operands of S = Q K^T):
//     ((8, m), (T, 2k)) : ((8T, SBO), (1, T)), swizzled by Swizzle<3,4,3>:
//     8 rows of 128 bytes (64 elements of K) form a 1024-byte atom; SBO is the byte distance from
//     one group of 8 rows to the next; LBO is not used (the PTX ISA: "assumed to be 1").
//   MN-major (each row's M or N elements contiguous; V as the B operand of O += P V, whose N is
//     head_dim and whose rows in shared memory are keys):
//     ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO)):
//     64 elements of N (128 bytes) by 8 rows of K form the atom; LBO is the byte distance from one
//     64-wide block of N to the next, SBO from one group of 8 K-rows to the next.
// Swizzle<3,4,3> is the 128-byte swizzle: the 16-byte chunk index (address bits 4-6) is XORed with
// the 128-byte row index inside the 1024-byte atom (bits 7-9). CU_TENSOR_MAP_SWIZZLE_128B writes
// exactly that pattern, so a tile the copy engine loaded is an operand as it lies.
constexpr uint64_t kSwizzle128B = 1;

// The descriptor of an operand that starts at `start` (shared memory), with these byte offsets (each
// a multiple of 16) and swizzle mode; base offset 0, so `start` lies in an atom that begins on the
// swizzle's repeat boundary.
__device__ inline uint64_t matrix_descriptor(const void* start, uint32_t leading_byte_offset,
                                             uint32_t stride_byte_offset, uint64_t swizzle = kSwizzle128B) {
  auto encode = [](uint32_t x) { return static_cast<uint64_t>((x & 0x3FFFF) >> 4); };
  return encode(shared_address(start)) | encode(leading_byte_offset) << 16 | encode(stride_byte_offset) << 32 |
         swizzle << 62;
}

// The descriptor `descriptor` with its start moved `bytes` (a multiple of 16) further into shared
// memory: the start address is the low field, in 16-byte units, and stays below 2^18 bytes, so the add
// never carries into the next field. The add is opaque to the compiler so that it stays where the wgmma
// is issued: hoisted out of a loop, the descriptors of every k-step of every operand would all stay
// live through the loop (or be spilled), where this way one per operand does.
__device__ inline uint64_t advance_descriptor(uint64_t descriptor, uint32_t bytes) {
  uint64_t moved;
  asm volatile("add.s64 %0, %1, %2;" : "=l"(moved) : "l"(descriptor), "l"(static_cast<uint64_t>(bytes >> 4)));
  return moved;
}

/// \cond HOPPER_INTERNAL
// The accumulator operands of one wgmma: N / 2 floats per thread, as "+f" asm operands.
#define FLASH_WGMMA_ACC8(d, i)                                                                             \
  "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), \
      "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define FLASH_WGMMA_ACC32(d, i) \
  FLASH_WGMMA_ACC8(d, (i) + 0), FLASH_WGMMA_ACC8(d, (i) + 8), FLASH_WGMMA_ACC8(d, (i) + 16), FLASH_WGMMA_ACC8(d, (i) + 24)
#define FLASH_WGMMA_ACC64(d) FLASH_WGMMA_ACC32(d, 0), FLASH_WGMMA_ACC32(d, 32)
#define FLASH_WGMMA_ACC80(d) \
  FLASH_WGMMA_ACC32(d, 0), FLASH_WGMMA_ACC32(d, 32), FLASH_WGMMA_ACC8(d, 64), FLASH_WGMMA_ACC8(d, 72)
// Their placeholders in the instruction text.
#define FLASH_WGMMA_D32                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define FLASH_WGMMA_D64                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FLASH_WGMMA_D80 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}"

// wgmma.mma_async with A and B from shared memory
// (asynchronous-warpgroup-level-matrix-instructions-wgmma-mma-async):
//   wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T d, a-desc, b-desc, scale-d, imm-scale-a,
//                                                 imm-scale-b, imm-trans-a, imm-trans-b;
// scale-d is a predicate: false computes D = A * B (the accumulators' old values are ignored),
// true D = A * B + D. imm-scale-a = -1 negates A. imm-trans-a/b = 0: K-major, 1: MN-major
// ("transposed"). The instruction text of one shape and type; wgmma_ss below picks it.
#define FLASH_WGMMA_SS(SHAPE, TYPE, DREGS, ACC, A, B, SCALE_D, SCALE_A, TRANS_B, TRANS_A)                     \
  asm volatile("{\n"                                                                                          \
               ".reg .pred p;\n"                                                                              \
               "setp.ne.b32 p, %" SCALE_D ", 0;\n"                                                            \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " " DREGS ", %" A ", %" B            \
               ", p, %" SCALE_A ", 1, %" TRANS_A ", %" TRANS_B ";\n"                                          \
               "}\n"                                                                                          \
               : ACC                                                                                          \
               : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kScaleA), "n"(kTransB),      \
                 "n"(kTransA))

// wgmma.mma_async with A from registers, B from shared memory:
//   wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T d, a, b-desc, scale-d, imm-scale-a, imm-scale-b,
//                                                 imm-trans-b;
// The instruction text of one shape and type; wgmma_rs below picks it.
#define FLASH_WGMMA_RS(SHAPE, TYPE, DREGS, ACC, A0, A1, A2, A3, B, SCALE_D, TRANS_B)                         \
  asm volatile("{\n"                                                                                          \
               ".reg .pred p;\n"                                                                              \
               "setp.ne.b32 p, %" SCALE_D ", 0;\n"                                                            \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " " DREGS ", {%" A0 ", %" A1 ", %" A2 \
               ", %" A3 "}, %" B ", p, 1, 1, %" TRANS_B ";\n"                                                 \
               "}\n"                                                                                          \
               : ACC                                                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)),  \
                 "n"(kTransB))
/// \endcond

// D (64 x N) (+)= A (64 x 16, shared memory, desc_a) * B (16 x N, shared memory, desc_b), N = 64,
// 128 or 160, fp32 accumulators d[N / 2]. kScaleA: 1, or -1 to negate A. kTransB: 0 K-major B, 1 MN-major.
// kTransA the same for A: 1 reads an A stored with its M dimension contiguous (stage 14's dS, written
// transposed by the threads that hold dS^T).
template <typename Element, int N, int kScaleA, int kTransB, int kTransA = 0>
__device__ inline void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 64 || N == 128 || N == 160, "the wrappers have N = 64, 128 and 160");
  static_assert(kScaleA == 1 || kScaleA == -1, "imm-scale-a is 1 or -1");
  static_assert(kTransB == 0 || kTransB == 1, "imm-trans-b is 0 or 1");
  static_assert(kTransA == 0 || kTransA == 1, "imm-trans-a is 0 or 1");
#if FLASH_HOPPER_SM90A
  if constexpr (N == 64) {
    if constexpr (std::is_same_v<Element, __nv_bfloat16>)
      FLASH_WGMMA_SS("m64n64k16", "bf16", FLASH_WGMMA_D32, FLASH_WGMMA_ACC32(d, 0), "32", "33", "34", "35", "36", "37");
    else
      FLASH_WGMMA_SS("m64n64k16", "f16", FLASH_WGMMA_D32, FLASH_WGMMA_ACC32(d, 0), "32", "33", "34", "35", "36", "37");
  } else if constexpr (N == 128) {
    if constexpr (std::is_same_v<Element, __nv_bfloat16>)
      FLASH_WGMMA_SS("m64n128k16", "bf16", FLASH_WGMMA_D64, FLASH_WGMMA_ACC64(d), "64",
                     "65", "66", "67", "68", "69");
    else
      FLASH_WGMMA_SS("m64n128k16", "f16", FLASH_WGMMA_D64, FLASH_WGMMA_ACC64(d), "64",
                     "65", "66", "67", "68", "69");
  } else {
    if constexpr (std::is_same_v<Element, __nv_bfloat16>)
      FLASH_WGMMA_SS("m64n160k16", "bf16", FLASH_WGMMA_D80, FLASH_WGMMA_ACC80(d), "80", "81", "82", "83", "84", "85");
    else
      FLASH_WGMMA_SS("m64n160k16", "f16", FLASH_WGMMA_D80, FLASH_WGMMA_ACC80(d), "80", "81", "82", "83", "84", "85");
  }
#else
  (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
#endif
}

// D (64 x N) (+)= A (64 x 16, registers a[4] per thread, the fragment above) * B (16 x N, shared
// memory, desc_b). The transpose of A is not available with A in registers.
template <typename Element, int N, int kTransB>
__device__ inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  static_assert(N == 64 || N == 128, "the wrappers have N = 64 and N = 128");
  static_assert(kTransB == 0 || kTransB == 1, "imm-trans-b is 0 or 1");
#if FLASH_HOPPER_SM90A
  if constexpr (N == 64) {
    if constexpr (std::is_same_v<Element, __nv_bfloat16>)
      FLASH_WGMMA_RS("m64n64k16", "bf16", FLASH_WGMMA_D32, FLASH_WGMMA_ACC32(d, 0), "32", "33", "34", "35", "36", "37",
                     "38");
    else
      FLASH_WGMMA_RS("m64n64k16", "f16", FLASH_WGMMA_D32, FLASH_WGMMA_ACC32(d, 0), "32", "33", "34", "35", "36", "37",
                     "38");
  } else {
    if constexpr (std::is_same_v<Element, __nv_bfloat16>)
      FLASH_WGMMA_RS("m64n128k16", "bf16", FLASH_WGMMA_D64, FLASH_WGMMA_ACC64(d), "64",
                     "65", "66", "67", "68", "69", "70");
    else
      FLASH_WGMMA_RS("m64n128k16", "f16", FLASH_WGMMA_D64, FLASH_WGMMA_ACC64(d), "64",
                     "65", "66", "67", "68", "69", "70");
  }
#else
  (void)d, (void)a, (void)desc_b, (void)accumulate;
#endif
}

#undef FLASH_WGMMA_SS
#undef FLASH_WGMMA_RS
#undef FLASH_WGMMA_D32
#undef FLASH_WGMMA_D64
#undef FLASH_WGMMA_D80
#undef FLASH_WGMMA_ACC8
#undef FLASH_WGMMA_ACC32
#undef FLASH_WGMMA_ACC64
#undef FLASH_WGMMA_ACC80

}  // namespace hopper

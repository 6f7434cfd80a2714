// tensor_core.cuh: the inline-PTX wrappers that stages 08 and later name in their lessons.
//
// Each wrapper is one PTX instruction (PTX ISA, "Warp-level matrix instructions" and "Data movement
// and conversion instructions: cp.async"; theory 11 cites the sections), so the stages read as the
// algorithm and this file as the instruction set.
// The fragment layouts the wrappers assume are drawn in docs/theory/11_tensor_cores.md. All of them
// need compute capability 8.0 (mma.sync with bf16, ldmatrix, cp.async); a stage that uses them
// checks the GPU before it launches. The few that Hopper (sm_90) adds say so, and what they compile to
// below it. At the end, what stages 10 on share besides instructions: the constants of a base-2
// softmax and the max and sum over the lanes that hold one row of an mma accumulator.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace tensor_core {

// The address of a shared-memory object as the 32-bit offset the shared-state-space PTX
// instructions take.
__device__ inline uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix.x4: four 8x8 matrices of 16-bit elements from shared memory into registers. Lane l
// passes the address of row l % 8 of matrix l / 8 (16 contiguous bytes). Afterwards lane l holds,
// in frag[m], elements (row l / 4, columns 2 * (l % 4) and 2 * (l % 4) + 1) of matrix m, packed
// low element first: exactly an mma operand register.
__device__ inline void ldmatrix_x4(uint32_t (&frag)[4], const void* row_address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
               : "r"(shared_address(row_address)));
#endif
}

// ldmatrix.x4.trans: the same four matrices, each transposed on the way: lane l gets
// (row 2 * (l % 4) and 2 * (l % 4) + 1, column l / 4). V is stored [key][dim], and the PV product
// wants it as a column-major B operand: the transpose is free here.
__device__ inline void ldmatrix_x4_trans(uint32_t (&frag)[4], const void* row_address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
               : "r"(shared_address(row_address)));
#endif
}

// mma.sync m16n8k16: acc (16x8, fp32) += A (16x16, row-major) * B (16x8, column-major), A and B in
// Element (__half or __nv_bfloat16). With g = lane / 4 and t = lane % 4, a lane holds
//   a[0]: A[g][2t..2t+1]    a[1]: A[g+8][2t..2t+1]    a[2]: A[g][2t+8..2t+9]    a[3]: A[g+8][2t+8..2t+9]
//   b[0]: B[2t..2t+1][g]    b[1]: B[2t+8..2t+9][g]
//   acc[0..1]: C[g][2t..2t+1]                          acc[2..3]: C[g+8][2t..2t+1]
template <typename Element>
__device__ inline void mma_m16n8k16(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

// The fp16 instance: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32.
template <>
__device__ inline void mma_m16n8k16<__half>(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The bf16 instance: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32.
template <>
__device__ inline void mma_m16n8k16<__nv_bfloat16>(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0,
                                                   uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two fp32 values rounded to Element and packed into one operand register, lo in the low half:
// how an fp32 accumulator becomes an A operand without leaving registers.
template <typename Element>
__device__ inline uint32_t pack2(float lo, float hi);

// Two fp32 values rounded to fp16 (to nearest even) in one register.
template <>
__device__ inline uint32_t pack2<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Two fp32 values rounded to bf16 (to nearest even) in one register.
template <>
__device__ inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// pack2's inverse: the two 16-bit floats of one register, low half first, as fp32 (exactly).
template <typename Element>
__device__ inline float2 unpack2(uint32_t packed);

// Two fp16 values of one register as fp32.
template <>
__device__ inline float2 unpack2<__half>(uint32_t packed) {
  return __half22float2(*reinterpret_cast<const __half2*>(&packed));
}

// Two bf16 values of one register as fp32.
template <>
__device__ inline float2 unpack2<__nv_bfloat16>(uint32_t packed) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed));
}

// cp.async.cg: 16 bytes from global to shared memory without passing through registers, and
// without waiting: the copy completes in the background. With valid = false nothing is read and
// the 16 bytes are zero-filled (src-size 0), which is how a tile past the end of the sequence is
// padded.
__device__ inline void cp_async_16(void* shared_dst, const void* global_src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared_dst)),
               "l"(global_src), "r"(valid ? 16 : 0));
#endif
}

// Closes the group of cp.async issued since the last commit; groups complete in order.
__device__ inline void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most kPending of this thread's committed groups are still in flight. Other
// threads' copies become visible only after a barrier that follows the wait.
template <int kPending>
__device__ inline void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

// red.global.add.f32: *address += value in global memory, atomically, without returning the old
// value (a reduction, not an atomic exchange: the warp does not wait for the result). Additions from
// different threads land in whatever order the memory system sees them, and fp32 addition is not
// associative: the sum is the same up to rounding, not bit for bit, from one run to the next.
__device__ inline void red_add_f32(float* address, float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(address), "f"(value));
#endif
}

// Two adjacent floats (address 8-byte aligned) added as red_add_f32 does. Hopper (sm_90) has the
// vector form, red.global.add.v2.f32, one instruction for both; older GPUs issue two scalar ones.
__device__ inline void red_add_f32x2(float* address, float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(lo), "f"(hi));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  red_add_f32(address, lo);
  red_add_f32(address + 1, hi);
#endif
}

// fence.proxy.async.shared::cta (PTX ISA, "Memory consistency model: proxies" and "membar/fence"):
// orders this thread's ordinary (generic-proxy) accesses to shared memory before its later
// async-proxy ones, the path of the bulk copies below and of stage 12's TMA and wgmma. A bulk copy
// reads shared memory that ordinary stores wrote only after each writer has fenced and a barrier (or
// __syncwarp) has ordered the writers before the thread that issues the copy. sm_90 on; nothing below.
__device__ inline void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// cp.reduce.async.bulk .add.f32 (PTX ISA, "Data movement and conversion instructions:
// cp.reduce.async.bulk"): global[i] += shared[i] for `bytes` / 4 floats, by the copy engine, in the
// background; one thread issues it. Both addresses 16-byte aligned, bytes a multiple of 16. Like
// red.global.add, the additions are atomic per element and their order among blocks is not fixed.
// Completion is tracked per issuing thread in bulk groups (bulk_commit, bulk_wait_read, bulk_wait).
// sm_90 on; nothing below, where a caller must not use it.
__device__ inline void bulk_reduce_add_f32(float* global_dst, const float* shared_src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global_dst),
               "r"(shared_address(shared_src)), "r"(bytes)
               : "memory");
#endif
}

// cp.async.bulk.commit_group: closes the group of bulk copies this thread issued since the last one.
__device__ inline void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

// cp.async.bulk.wait_group.read: waits until at most kPending of this thread's bulk groups have not yet
// finished reading their source, so that the shared memory they read may be written again.
template <int kPending>
__device__ inline void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}

// cp.async.bulk.wait_group: waits until at most kPending of this thread's bulk groups are incomplete,
// their writes to global memory included.
template <int kPending>
__device__ inline void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Programmatic dependent launch (PTX ISA, "griddepcontrol"; CUDA Programming Guide, "Programmatic
// Dependent Launch and Synchronization": compute capability 9.0 on). launch_dependents: the grid the
// host launched after this one with cudaLaunchAttributeProgrammaticStreamSerialization may be
// scheduled once every block of this grid has issued it or exited, before this grid ends. Both compile
// to nothing below sm_90, where the next grid starts after this one ends, as it always did.
__device__ inline void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// griddepcontrol.wait: blocks until every grid this one depends on has completed and its memory
// operations are visible to this grid. What a dependent grid does before it is what overlaps.
__device__ inline void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ex2.approx.ftz: 2^x on the special-function unit in one instruction, subnormal inputs and results
// flushed to zero. The fast-math intrinsic __expf is a multiply by log2 e and this; expf adds the
// instructions around the ex2 that keep it within 2 ulp of exp(x), the maximum error the CUDA Math
// API documents for it.
__device__ inline float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The softmax of stages 10 on is computed in base 2: exp(x) = 2^(x log2 e), with log2 e folded into
// the score scale, and a row's base-2 lse brought back to base e once, by ln 2.
constexpr float kLog2e = 1.4426950408889634f;  // log2(e)
constexpr float kLn2 = 0.6931471805599453f;    // ln(2)
constexpr unsigned kFullWarp = 0xffffffffu;     // the mask of a *_sync warp function that every lane calls

// The max of one row of an mma accumulator. Rows g and g + 8 of the 16x8 tile are held by the four
// lanes 4g..4g+3 (columns 2t, 2t + 1 at lane 4g + t: mma_m16n8k16's layout), so two butterfly steps,
// lane ^ 1 then lane ^ 2, give each of the four the row's result. Every lane of the warp must call it.
__device__ inline float max_over_row_lanes(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullWarp, x, 2));
}

// The sum of one row of an mma accumulator, over the same four lanes and in the same two steps as
// max_over_row_lanes. Every lane of the warp must call it.
__device__ inline float sum_over_row_lanes(float x) {
  x += __shfl_xor_sync(kFullWarp, x, 1);
  return x + __shfl_xor_sync(kFullWarp, x, 2);
}

}  // namespace tensor_core

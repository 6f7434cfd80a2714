// Stage 14's main kernel: dK and dV of one K/V tile, and that tile's share of dQ, on wgmma.
// mainloop.cuh holds its pieces; this file is the order they run in.
//
// One block per K/V tile of 128 keys of one K/V head, 3 warpgroups: two consumers, 64 keys each, and a
// producer warpgroup. The producer's load warp loads K and V once, then streams Q, dO and their rows'
// lse and D through two stages (TMA; mbarriers count the bytes, named barriers free the stages), as
// stage 12's producer streams K and V; its dQ warp adds dQ. Per step (a query tile of one query head
// of the group), each consumer warpgroup:
//   1. S^T = K Q^T (K's first k-steps from registers) and dP^T = V dO^T on the tensor cores (two
//      wgmma groups; P^T is computed while dP^T is still running);
//   2. P^T and dS^T = P^T o (dP^T - D) in registers;
//   3. dV += P^T dO, with P^T as a register A operand, while it writes dS^T to shared memory;
//   4. after the two warpgroups meet, its 64 x 64 share of dQ = dS K, then dK += dS^T Q (dS^T from
//      registers); while dK runs, the share is staged in shared memory, and the dQ warp hands each
//      warpgroup's share to the copy engine, which adds it to the fp32 accumulator in global memory
//      (cp.reduce.async.bulk .add.f32).
// With kDeterministic the adds to each query tile's accumulator happen in a fixed order (dq_add_rank):
// the dQ warp waits for a counter per query tile to reach its block's place in that order before it
// issues the block's two adds, and counts them once the copy engine has written them. dK and dV are summed in
// registers over the query heads of the GQA group and written once, at the end.
#pragma once

#include "mainloop.cuh"

namespace stage14 {

// setmaxnreg counts: 384 threads get 65536 / 384 = 170, rounded down to 168 (__launch_bounds__(384,
// 1)); the producer warpgroup keeps 24, the two consumers take 240 (2 x 128 x 240 + 128 x 24 = 64512
// of the 65536).
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
// The producer warpgroup's warps: warp 0 loads, warp 1 adds dQ; the other two only give registers back.
constexpr int kLoadWarp = 0;
constexpr int kDqWarp = 1;

// Deterministic mode: spins until `counter` (in global memory) reaches `expected`, then orders what
// it saw before this thread's next async-proxy access (the copy engine's add).
__device__ inline void wait_for_count(const int* counter, int expected) {
  while (hopper::load_acquire_gpu(counter) < expected) {
  }
  hopper::fence_proxy_async_global();
}

// Counts one add: the copy engine's writes (waited for by bulk_wait<0>, then ordered before the
// generic proxy) before the count, which releases them.
__device__ inline void count_add(int* counter) {
  hopper::fence_proxy_async_global();
  hopper::red_release_add_gpu<1>(counter);
}

// The dQ warp: for each step and each consumer warpgroup, once the warpgroup has staged its share of
// dQ, lane 0 hands the share to the copy engine, which adds it to its part of the query tile's
// accumulator in global memory; once the engine has read it, the warp frees that part of the staging
// buffer for the warpgroup's next share. Deterministic: once both shares are staged, the block's two
// adds wait for their turn (dq_add_rank) and are counted once written.
template <class Tiles, bool kCausal, bool kDeterministic>
__device__ void add_dq_shares(float* staging, const BlockWork& work, const ProblemShape& problem, float* dq_accum,
                              int* dq_counters) {
  using L = SharedLayout<Tiles>;
  const int lane = threadIdx.x % 32;
  const int num_q_tiles_per_head = problem.padded_seq_q / Tiles::kBlockRows;
  const int steps = work.steps();
  for (int c = 0; c < kConsumers; ++c) dq_barrier_arrive<kDqFreeBarrier>(c);  // the buffers start empty
  for (int n = 0; n < steps; ++n) {
    int q_bh, q_tile;
    work.step(n, q_bh, q_tile);
    const long long tile = static_cast<long long>(q_bh) * num_q_tiles_per_head + q_tile;
    float* accum = dq_accum + tile * L::kDqFloats;
    if constexpr (kDeterministic) {
      // The blocks after this one in the order wait from its turn until its count, so both shares are
      // staged before it takes its turn: their wait then spans only the two adds.
      for (int c = 0; c < kConsumers; ++c) dq_barrier_wait<kDqStagedBarrier>(c);
      if (lane == 0) {
        wait_for_count(dq_counters + tile, dq_add_rank<Tiles, kCausal>(work, problem, q_tile));
        for (int c = 0; c < kConsumers; ++c)
          tensor_core::bulk_reduce_add_f32(accum + c * kDqShareFloats, staging + c * kDqShareFloats,
                                           kDqShareFloats * 4);
        hopper::bulk_commit();
        hopper::bulk_wait<0>();
        count_add(dq_counters + tile);
      }
      __syncwarp();
      for (int c = 0; c < kConsumers; ++c)
        if (n + 1 < steps) dq_barrier_arrive<kDqFreeBarrier>(c);
    } else {
      for (int c = 0; c < kConsumers; ++c) {
        dq_barrier_wait<kDqStagedBarrier>(c);
        if (lane == 0) {
          tensor_core::bulk_reduce_add_f32(accum + c * kDqShareFloats, staging + c * kDqShareFloats,
                                           kDqShareFloats * 4);
          hopper::bulk_commit();
          hopper::bulk_wait_read<0>();
        }
        __syncwarp();
        if (n + 1 < steps) dq_barrier_arrive<kDqFreeBarrier>(c);
      }
    }
  }
  if (lane == 0) hopper::bulk_wait<0>();  // the last add written before the block's shared memory goes
}

// q_map, k_map, v_map, do_map: 3-D tensor maps (head_dim, sequence, batch x heads) over q, k, v, d_o
// with boxes of (64, Br or 128, 1), 128-byte swizzle (at head_dim 32 a box row is wider than a tensor
// row: BackwardTiles). lse2, d, dq_accum, dq_counters: the workspace
// that steps.cuh's first kernel filled (the base-2 lse and D per row, the zeroed accumulator and
// counters). dk, dv: [batch, heads_kv, seq_kv, head_dim].
template <typename Element, int kHeadDim, bool kCausal, bool kDeterministic>
__global__ void __launch_bounds__(kThreads, 1)
    backward_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                    const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap do_map,
                    const float* lse2, const float* d, float* dq_accum, int* dq_counters, Element* dk, Element* dv,
                    ProblemShape problem) {
#if FLASH_HOPPER_SM90A
  using Tiles = BackwardTiles<kHeadDim>;
  constexpr int kBlockRows = Tiles::kBlockRows;
  static_assert(sizeof(Element) == kElementBytes, "16-bit elements");
  extern __shared__ unsigned char shared_raw[];
  const Smem<Element, Tiles> sm(shared_raw);
  init_barriers(sm);
  const BlockWork work = block_work<Tiles, kCausal, kDeterministic>(problem);
  // The warpgroup index as lane 0 has it, so that ptxas knows it is the same in every lane (stage 12's
  // uniform_warpgroup).
  const int warpgroup = __shfl_sync(tensor_core::kFullWarp, threadIdx.x / kWarpgroupThreads, 0);

  if (warpgroup == kConsumers) {
    hopper::setmaxnreg_dec<kProducerRegisters>();
    const int warp = (threadIdx.x % kWarpgroupThreads) / 32;
    if (warp == kLoadWarp)
      produce<Element, Tiles>(sm, work, problem, &q_map, &k_map, &v_map, &do_map, lse2, d);
    if (warp == kDqWarp) add_dq_shares<Tiles, kCausal, kDeterministic>(sm.dq(), work, problem, dq_accum, dq_counters);
    return;
  }
  hopper::setmaxnreg_inc<kConsumerRegisters>();
  const int thread = threadIdx.x % kWarpgroupThreads;
  const FragmentPlace at(warpgroup, thread);
  float acc_dk[Tiles::kHeadDim / 2] = {};
  float acc_dv[Tiles::kHeadDim / 2] = {};
  mbarrier_wait(sm.kv_full(), 0);
  // The first k-steps of the warpgroup's K, as S^T's A operand for the whole block (BackwardTiles).
  uint32_t k_frag[Tiles::kKeyFragments][4];
  load_key_fragments<Tiles>(k_frag, sm.k(0), at);

  const int steps = work.steps();
  auto step = [&](int n, auto masked) {
    int q_bh, q_tile;
    work.step(n, q_bh, q_tile);
    const int s = stage_of(n);
    const uint32_t parity = parity_of(n);
    const int first_row = q_tile * kBlockRows;
    float s_t[kBlockRows / 2];
    float dp_t[kBlockRows / 2];
    // 1. S^T and dP^T; at Br = 64 the lse of this thread's columns into registers first
    // (BackwardTiles::kLseAhead), at Br = 128 read from shared memory as P^T needs each pair.
    mbarrier_wait(sm.q_full(s), parity);
    [[maybe_unused]] float2 lse2_ahead[kBlockRows / 8];
    if constexpr (Tiles::kLseAhead) load_lse2<Tiles>(lse2_ahead, sm.lse2(s), at);
    auto lse2_pair = [&](int i) {
      if constexpr (Tiles::kLseAhead)
        return lse2_ahead[i];
      else
        return *reinterpret_cast<const float2*>(sm.lse2(s) + 8 * i + 2 * at.t);
    };
    wgmma_fence();
    issue_scores<Element, Tiles>(s_t, k_frag, sm.k(0), sm.q(s, 0), warpgroup);
    wgmma_commit_group();
    mbarrier_wait(sm.do_full(s), parity);
    issue_transposed_scores<Element, Tiles>(dp_t, sm.v(0), sm.d_o(s, 0), warpgroup);
    wgmma_commit_group();
    // 2. P^T while dP^T runs, then dS^T.
    wgmma_wait_group<1>();
    fence_registers(s_t);
    probabilities<Tiles, kCausal, decltype(masked)::value>(s_t, lse2_pair, at, work.first_key, first_row, problem);
    wgmma_wait_group<0>();
    fence_registers(dp_t);
    score_gradients<Tiles>(dp_t, s_t, sm.d(s), at);
    uint32_t p_frag[kBlockRows / 16][4], ds_frag[kBlockRows / 16][4];
    to_a_fragments<Element, kBlockRows>(s_t, p_frag);
    to_a_fragments<Element, kBlockRows>(dp_t, ds_frag);
    // 3. dV; dS^T to shared memory meanwhile.
    wgmma_fence();
    issue_key_gradient<Element, Tiles>(acc_dv, p_frag, sm.d_o(s, 0));
    wgmma_commit_group();
    store_ds<Element, Tiles>(sm, n, ds_frag, at);
    hopper::fence_proxy_async_shared();  // the dS^T stores, before wgmma reads them
    hopper::named_barrier_sync<kDsWrittenBarrier, kConsumerThreads>();
    // 4. The warpgroup's share of dQ, then dK behind it: the tensor cores run dK while the share is
    // staged for the dQ warp. At Br = 64, dV done first (BackwardTiles::kDvBeforeDq).
    if constexpr (Tiles::kDvBeforeDq) {
      wgmma_wait_group<0>();
      fence_registers(acc_dv);
      fence_registers(p_frag);
    }
    float acc_dq[kWgmmaM / 2];
    wgmma_fence();
    issue_dq_share<Element, Tiles>(acc_dq, sm, n, warpgroup);
    wgmma_commit_group();
    issue_key_gradient<Element, Tiles>(acc_dk, ds_frag, sm.q(s, 0));
    wgmma_commit_group();
    wgmma_wait_group<1>();  // dV and the dQ share; dK may still run
    fence_registers(acc_dq);
    fence_registers(acc_dv);
    fence_registers(p_frag);
    float* staging = sm.dq();
    dq_barrier_wait<kDqFreeBarrier>(warpgroup);
#pragma unroll
    for (int j = 0; j < kWgmmaM / 8; ++j)
      *reinterpret_cast<float4*>(staging + dq_share_offset(warpgroup, j, thread)) =
          make_float4(acc_dq[4 * j], acc_dq[4 * j + 1], acc_dq[4 * j + 2], acc_dq[4 * j + 3]);
    hopper::fence_proxy_async_shared();  // the staging stores, before the copy engine reads them
    dq_barrier_arrive<kDqStagedBarrier>(warpgroup);
    wgmma_wait_group<0>();  // dK
    fence_registers(acc_dk);
    fence_registers(ds_frag);
    // Every product that read Q and dO is done, and lse and D were read: the load warp may refill the
    // stage (it waits only for the stages it loads again).
    if (n + kStages < steps) stage_free_arrive(s);
  };

  for (int n = 0; n < steps; ++n) {
    int q_bh, q_tile;
    work.step(n, q_bh, q_tile);
    if (needs_mask<Tiles, kCausal>(problem, work.first_key, q_tile))
      step(n, Masked{});
    else
      step(n, Unmasked{});
  }

  // dK = scale * sum dS^T Q and dV, rounded to Element; rows past seq_kv are not written, nor the
  // tiles' zero columns at head_dim 32 (kHeadDim here is the tensors').
  const long long kv_row0 = static_cast<long long>(work.kv_bh) * problem.seq_kv;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = work.first_key + at.key0 + 8 * h;
    if (key >= problem.seq_kv) continue;
    Element* dk_row = dk + (kv_row0 + key) * kHeadDim;
    Element* dv_row = dv + (kv_row0 + key) * kHeadDim;
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) {
      const int col = 8 * i + 2 * at.t;
      *reinterpret_cast<uint32_t*>(dk_row + col) =
          pack2<Element>(acc_dk[4 * i + 2 * h] * problem.scale, acc_dk[4 * i + 2 * h + 1] * problem.scale);
      *reinterpret_cast<uint32_t*>(dv_row + col) = pack2<Element>(acc_dv[4 * i + 2 * h], acc_dv[4 * i + 2 * h + 1]);
    }
  }
#else
  // Compiled for another target: never launched (stage14::check_gpu refuses first).
  (void)q_map, (void)k_map, (void)v_map, (void)do_map, (void)lse2, (void)d, (void)dq_accum, (void)dq_counters,
      (void)dk, (void)dv, (void)problem;
#endif
}

}  // namespace stage14

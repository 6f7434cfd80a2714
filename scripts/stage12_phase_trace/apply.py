#!/usr/bin/env python3
"""Stage 12's per-block phase trace (RUNS.md, 2026-11-25 fourth session, call 1): where a block's time
goes, from its first instruction to its last store. Patches a copy of stages/12_hopper/hopper_kernel.cuh
at commit c924da4 (version B registered, before the TMA store) so that thread 0 of each warpgroup records
clock64() at six points into a __device__ array; trace.cu runs the registered stage and prints the medians.
The anchors are that commit's text: the script stops on the first one it does not find.

    git archive c924da4 stages/12_hopper common | tar x -C /tmp/trace
    python3 scripts/stage12_phase_trace/apply.py /tmp/trace/stages/12_hopper/hopper_kernel.cuh
    cp scripts/stage12_phase_trace/trace.cu /tmp/trace && cd /tmp/trace
    nvcc -std=c++17 -O3 -arch=sm_90a -DFLASH_STAGE12_SM90A=1 -Icommon -Istages/12_hopper trace.cu -o trace
    ./trace B H N D CAUSAL      # e.g. ./trace 16 16 1024 128 0
"""
import sys

path = sys.argv[1]
s = open(path).read()


def rep(old, new):
    global s
    if s.count(old) != 1:
        raise SystemExit(f"anchor not found once: {old[:60]!r}")
    s = s.replace(old, new)


# The record: [block][point] = clock64(); 8 = the block's K/V tiles, 9 and 10 = %globaltimer at the
# start and at consumer 1's end, 11 = the SM.
rep('namespace stage12 {\n\n// One kernel instance.', '''namespace stage12 {
__device__ long long g_trace[1 << 16][12];
#define TRACE_AT(i) do { if (threadIdx.x % 128 == 0) g_trace[blockIdx.x][i] = clock64(); } while (0)
__device__ inline long long global_ns() { long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }

// One kernel instance.''')
# 2: consumer 0 has its Q (and may go); 3: tile 0's scores and softmax done; 4: the loop done;
# 5: the last P V product done and Q released.
rep('''  if (Config::kPingPong && w.consumer == 1) pass_turn(1);  // consumer 0 goes first
''', '''  if (Config::kPingPong && w.consumer == 1) pass_turn(1);  // consumer 0 goes first
  if (w.consumer == 0) TRACE_AT(2);
''')
rep('''      softmax(Unmasked{}, 0, p_even, rescale);
  }
''', '''      softmax(Unmasked{}, 0, p_even, rescale);
  }
  if (w.consumer == 0) TRACE_AT(3);
''')
rep('''  // The last tile's O += P V. Its P''', '''  if (w.consumer == 0) TRACE_AT(4);
  // The last tile's O += P V. Its P''')
rep('''  release(sm.q_empty(), lane);
}

// O normalized''', '''  release(sm.q_empty(), lane);
  if (w.consumer == 0) TRACE_AT(5);
}

// O normalized''')
# 0: the block's first instruction; 1: after the barriers' initialization (__syncthreads).
rep('''  if (threadIdx.x == 0) {
    hopper::mbarrier_init(sm.q_full(), 1);''', '''  if (threadIdx.x == 0) {
    g_trace[blockIdx.x][0] = clock64();
    g_trace[blockIdx.x][9] = global_ns();
    unsigned smid; asm volatile("mov.u32 %0, %smid;" : "=r"(smid)); g_trace[blockIdx.x][11] = smid;
    hopper::mbarrier_init(sm.q_full(), 1);''')
rep('''  __syncthreads();

  // Work tile''', '''  __syncthreads();
  TRACE_AT(1);

  // Work tile''')
# 6, 7: consumer 0's, consumer 1's stores of O issued.
rep('''      store_output<Element, kHeadDim>(o + t.bh * seq_q * kHeadDim, lse ? lse + t.bh * seq_q : nullptr, acc_o,
                                      row_max2, row_sum, row0, seq_q, lane % 4);
''', '''      store_output<Element, kHeadDim>(o + t.bh * seq_q * kHeadDim, lse ? lse + t.bh * seq_q : nullptr, acc_o,
                                      row_max2, row_sum, row0, seq_q, lane % 4);
      if (threadIdx.x % 128 == 0) { g_trace[blockIdx.x][6 + warpgroup] = clock64(); g_trace[blockIdx.x][8] = t.num_tiles; if (warpgroup == 1) g_trace[blockIdx.x][10] = global_ns(); }
''')
open(path, "w").write(s)

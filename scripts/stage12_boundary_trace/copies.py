#!/usr/bin/env python3
"""Copies of stage 12's registered kernel for timing its work-tile boundary (RUNS.md, fourteenth session,
calls 1-8; lesson 12, "The work-tile boundary, cycle by cycle"). Each copy is a folder that driver.cu builds
against: hopper_kernel.cuh and a hopper.cu cut before variant_name (so that only the kernels of one launch
compile) and the headers they include, all from a git ref, and launch.inc, the launch driver.cu calls.

    scripts/stage12_boundary_trace/copies.py DIR REF traced            # clock64 at the boundary's events
    scripts/stage12_boundary_trace/copies.py DIR REF plain [PATCH ...]  # untraced, PATCH: lse_after, noinit,
                                                                        #   stmatrix
    scripts/stage12_boundary_trace/copies.py DIR REF plain --configs A,B  # launch_key_tiles<A, B> (a branch's
                                                                           #   variant) instead of main's
    nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -DFLASH_STAGE12_SM90A=1 -I DIR -I common \\
      -I stages/12_hopper scripts/stage12_boundary_trace/driver.cu -o BIN
    BIN B H N D CAUSAL        # bf16, heads_kv = heads_q: 40 timed launches, then the trace of one more

The anchors are the text of main at 364f147 (and of the branch stage12-work-behind-last-product for
stmatrix); the script stops on the first one it does not find.
"""
import pathlib
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parents[2]
out, ref, kind = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
args = sys.argv[4:]
configs = None
if "--configs" in args:
    i = args.index("--configs")
    configs = args[i + 1].split(",")
    args = args[:i] + args[i + 2:]


def at_ref(path):
    return subprocess.run(["git", "-C", str(root), "show", f"{ref}:{path}"], capture_output=True, text=True,
                          check=True).stdout


kernel = at_ref("stages/12_hopper/hopper_kernel.cuh")
launcher = at_ref("stages/12_hopper/hopper.cu")
launcher = launcher[:launcher.index("const char* variant_name(Variant variant) {")] + "}  // namespace stage12\n"


def rep(s, old, new, after=None):
    """s with old replaced by new (once), or, with after, new inserted after the line holding the
    after-th occurrence of old."""
    if after is None:
        if s.count(old) != 1:
            raise SystemExit(f"anchor not found once: {old[:60]!r}")
        return s.replace(old, new)
    lines, n = s.split("\n"), 0
    for i, line in enumerate(lines):
        if old in line:
            n += 1
            if n == after:
                lines.insert(i + 1, new)
                return "\n".join(lines)
    raise SystemExit(f"anchor not found: {old[:60]!r} #{after}")


# The record: g_trace[block][step][consumer][event] = clock64() of thread 0 of the consumer warpgroup;
# event 11 holds the work tile's K/V tiles. g_block_ns: %globaltimer at a block's start and at each
# consumer's end. Both exist in every copy, so that one driver builds against any of them.
RECORD = r'''
constexpr int kTraceBlocks = 132, kTraceSteps = 64, kTraceEvents = 24;
__device__ long long g_trace[kTraceBlocks][kTraceSteps][2][kTraceEvents];
__device__ long long g_block_ns[kTraceBlocks][3];
__shared__ long long* trace_slot[2];
__device__ inline long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ inline long long clock_now() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
// The clock once dep is computed.
__device__ inline long long clock_after(float dep) {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t) : "f"(dep) : "memory");
  return t;
}
#define TRACE(c, i) do { if (threadIdx.x % 128 == 0 && trace_slot[c]) trace_slot[c][i] = clock_now(); } while (0)
#define TRACE_DEP(c, i, dep) \
  do { if (threadIdx.x % 128 == 0 && trace_slot[c]) trace_slot[c][i] = clock_after(dep); } while (0)
'''
kernel = rep(kernel, "namespace stage12 {\n", "namespace stage12 {\n" + RECORD)

if kind == "traced":
    T = "TRACE(w.consumer, %d);"
    k = kernel
    k = rep(k, "mbarrier_wait(sm.q_full(w.q_round), sm.q_parity(w.q_round));", T % 1, after=2)
    k = rep(k, "  mbarrier_wait(sm.q_full(w.q_round), sm.q_parity(w.q_round));\n" + T % 1,
            T % 12 + "\n  mbarrier_wait(sm.q_full(w.q_round), sm.q_parity(w.q_round));\n" + T % 1)
    k = rep(k, "mbarrier_wait(sm.k_full(slot(0)), parity(0));", T % 2, after=1)
    k = rep(k, "    if (Config::kPingPong) wait_for_turn(w.consumer);", T % 3, after=1)
    k = rep(k, "    issue_scores<Element, kHeadDim, Config>(s, sm.q(w.q_round, w.consumer, 0), sm.k(slot(0), 0));\n"
               "    wgmma_commit_group();\n    if (Config::kPingPong) pass_turn(w.consumer);",
            "    issue_scores<Element, kHeadDim, Config>(s, sm.q(w.q_round, w.consumer, 0), sm.k(slot(0), 0));\n"
            "    wgmma_commit_group();\n" + T % 13 + "\n    if (Config::kPingPong) pass_turn(w.consumer);\n" + T % 14)
    k = rep(k, "    behind_first_scores();\n    wgmma_wait_group<0>();",
            "    behind_first_scores();\n" + T % 4 + "\n    wgmma_wait_group<0>();\n" + T % 5)
    k = rep(k, "  after_first_tile();", "TRACE_DEP(w.consumer, 6, row_sum[0] + row_sum[1]);\n  after_first_tile();")
    k = rep(k, "  const int last = w.num_tiles - 1;", "TRACE_DEP(w.consumer, 7, row_sum[0] + row_sum[1]);", after=1)
    k = rep(k, "  if (Config::kPingPong) wait_for_turn(w.consumer);", T % 8, after=3)
    k = rep(k, "  issue_output<Element, kHeadDim, Config>(o, p_even, sm.v(st, 0));\n  wgmma_commit_group();\n"
               "  if (Config::kPingPong) pass_turn(w.consumer);\n  wgmma_wait_group<0>();",
            "  issue_output<Element, kHeadDim, Config>(o, p_even, sm.v(st, 0));\n  wgmma_commit_group();\n"
            "  if (Config::kPingPong) pass_turn(w.consumer);\n  wgmma_wait_group<0>();\n" + T % 9)
    k = rep(k, "  hopper::fence_proxy_async_shared();  // the stores above, before the copy engine reads them\n"
               "  warpgroup_sync(consumer);",
            "TRACE(consumer, 15);\n  hopper::fence_proxy_async_shared();  // the stores above, before the copy engine "
            "reads them\nTRACE(consumer, 16);\n  warpgroup_sync(consumer);\nTRACE(consumer, 17);")
    k = rep(k, "    hopper::bulk_commit();", "TRACE(consumer, 18);", after=1)
    k = rep(k, "      if (!work_tile_of_step(step, t)) continue;",
            "      const long long loop_top = clock_now();\n"
            "      if (!work_tile_of_step(step, t)) continue;\n"
            "      if (threadIdx.x % 128 == 0) {\n"
            "        trace_slot[warpgroup] = step < kTraceSteps ? &g_trace[blockIdx.x][step][warpgroup][0] : nullptr;\n"
            "        if (trace_slot[warpgroup]) trace_slot[warpgroup][11] = t.num_tiles;\n"
            "      }\n      TRACE(warpgroup, 0);\n"
            "      if (threadIdx.x % 128 == 0 && trace_slot[warpgroup]) trace_slot[warpgroup][19] = loop_top;")
    k = rep(k, "          finished.out = round_output<Element, kHeadDim>(acc_o, row_max2, row_sum);",
            "TRACE_DEP(warpgroup, 10, __uint_as_float(finished.out.words[1][kHeadDim / 8 - 1]) + finished.out.sum[1]);",
            after=1)
    k = rep(k, "    if constexpr (Config::kRegisterSplit) hopper::setmaxnreg_inc<kConsumerRegisters>();",
            "    if (threadIdx.x == 0) g_block_ns[blockIdx.x][0] = global_ns();\n"
            "    if (threadIdx.x % 128 == 0) trace_slot[warpgroup] = nullptr;", after=1)
    k = rep(k, "    store_finished();\n    release_stored_q();",
            "    if (threadIdx.x % 128 == 0) g_block_ns[blockIdx.x][1 + warpgroup] = global_ns();\n"
            "    store_finished();\n    release_stored_q();")
    kernel = k
elif kind == "plain":
    for patch in args:
        if patch == "lse_after":  # lse written after the TMA store of O is issued
            kernel = rep(kernel, """    const int row = first_row + tile_row;
    if (lse_head && t == 0 && row < seq_q) lse_head[row] = row_lse(out.row_max2[h], out.sum[h]);
  }""", "  }")
            kernel = rep(kernel, """      mbarrier_arrive(sm.q_empty(q_round));
    }
  }
""", """      mbarrier_arrive(sm.q_empty(q_round));
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = first_row + 16 * warp + g + 8 * h;
    if (lse_head && t == 0 && row < seq_q) lse_head[row] = row_lse(out.row_max2[h], out.sum[h]);
  }
""")
        elif patch == "noinit":  # S and P not zeroed at a work tile's start
            kernel = rep(kernel, "  float s[kBlockCols / 2] = {};\n  Operand p_even = {}, p_odd = {};",
                         "  float s[kBlockCols / 2];\n  Operand p_even, p_odd;")
        elif patch == "stmatrix":  # O into shared memory by stmatrix.x4, 4 a warp at head_dim 64 (branch text)
            kernel = rep(kernel, """#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int tile_row = 16 * warp + g + 8 * h;               // tile_row % 8 == g
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) {
      unsigned char* line = sm.q(q_round, consumer, i / kChunksPerRow) + tile_row * kSwizzleBytes;
      *reinterpret_cast<uint32_t*>(line + ((i % kChunksPerRow) ^ g) * kChunkBytes + 4 * t) = out.words[h][i];
    }
    const int row = first_row + tile_row;
    if (lse_head && t == 0 && row < seq_q) lse_head[row] = out.lse[h];
  }
""", """  {
    // Lane l gives the address of row l % 8 of matrix l / 8; matrix m of group k is (h = m / 2,
    // chunk 2k + m % 2), its registers this thread's words of it.
    const int m = lane / 8, r8 = lane % 8;
    const int tile_row = 16 * warp + 8 * (m / 2) + r8;
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      const int i = 2 * k + m % 2;
      unsigned char* line = sm.q(q_round, consumer, i / kChunksPerRow) + tile_row * kSwizzleBytes;
      const uint32_t addr = hopper::shared_address(line + ((i % kChunksPerRow) ^ r8) * kChunkBytes);
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\\n" ::"r"(addr),
                   "r"(out.words[0][2 * k]), "r"(out.words[0][2 * k + 1]), "r"(out.words[1][2 * k]),
                   "r"(out.words[1][2 * k + 1]) : "memory");
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = first_row + 16 * warp + g + 8 * h;
    if (lse_head && t == 0 && row < seq_q) lse_head[row] = out.lse[h];
  }
""")
        else:
            raise SystemExit(f"unknown patch {patch}")
else:
    raise SystemExit("kind: traced or plain")

call = "launch_key_tiles" + (f"<stage12::{configs[0]}, stage12::{configs[1]}>" if configs else "")
out.mkdir(parents=True, exist_ok=True)
(out / "hopper_kernel.cuh").write_text(kernel)
(out / "hopper.cu").write_text(launcher)
# The headers they include, from the same ref (found first: -I DIR comes before common and stages/12_hopper).
for header in ("stages/12_hopper/hopper.h", "common/hopper.cuh", "common/tensor_core.cuh", "common/flash_stage.cuh"):
    (out / pathlib.Path(header).name).write_text(at_ref(header))
launch_inc = f"""// Written by copies.py: {ref}'s schedule for the registered variant (pairs at any head count).
inline flash::Status run_stage12(const void* q, const void* k, const void* v, void* o, float* lse, int batch,
                                 int heads, int seq, int head_dim, float scale, bool causal) {{
  return stage12::{call}(q, k, v, o, lse, batch, heads, heads, seq, seq, head_dim, scale, causal,
                         flash::DType::kBf16, nullptr, stage12::Schedule::kPairsAlways);
}}
"""
(out / "launch.inc").write_text(launch_inc)
print(f"{out}: {kind} {' '.join(args)} {call}")

// flash-stages-bench: times the forward of every stage in the registry over the FlashAttention
// benchmark grid. Stages are found by walking registry::stages(), so a new stage is benchmarked as
// soon as it is registered.
//
// Google Benchmark writes the JSON the plots read:
//   build/bin/flash-stages-bench --benchmark_filter=stage03
//       --benchmark_out=bench/results/stage03.json --benchmark_out_format=json   (one line)
// (--benchmark_format=json prints the same to stdout.)
//
// The exercises (exercises/README.md) are timed as their stages are, under "exercise" names
// (exercise05_warp_shuffle/d64/causal0), when the filter asks for them:
//   build/bin/flash-stages-bench --benchmark_filter='(stage|exercise)05'
// Left out otherwise: as shipped they compute wrong results, and a default run feeds the plots.
//
// A decoding stage (registry max_seq_q set, stage 13) is not run on that grid, whose every problem has
// seq_q = seq_kv. It gets a decode family of its own (register_decode_benchmarks): one new query per
// sequence, head_dim 128, 32 query heads on 8 K/V heads (GQA 4), bf16, at the three target shapes and
// over cache lengths at batch 1, contiguous and paged; GB/s over the K and V bytes read, with L2
// flushed before every call. Its JSON is bench/results/h100_bench_decode.json:
//   build/bin/flash-stages-bench --benchmark_filter=decode --benchmark_out=h100_bench_decode.json
//       --benchmark_out_format=json   (one line)
//
// Each case times every iteration with CUDA events and reports the median as the counter
// median_ms; TFLOP/s and GB/s are computed from that median. One repetition of many iterations
// rather than Repetitions(3): the O(N^2)-memory stages take about a second per call at N = 16384,
// so three repetitions of the whole grid would run past the few minutes this binary should take,
// and the median over iterations already discards outliers.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_grid.h"
#include "harness.h"
#include "l2_flush.h"
#include "registry.h"

namespace {

constexpr int kExitNoGpu = 2;  // as in the course runner, so scripts can tell "no GPU" from a failure
using bench_grid::kSeed;

// bench_grid.h's grid: batch * seq = kTokens. The fp32 stages run kFp32Heads heads at every head_dim
// (at N = 4096, the batch 4 x 16 heads problem the stages' targets are stated for); the
// half-precision families heads * head_dim = kHeadsTimesDim, the grid of bench/compare.py, so that
// their figures sit next to PyTorch's.
const std::vector<int>& kSeqLens = bench_grid::seq_lens();
const std::vector<int>& kHeadDims = bench_grid::head_dims();

// Enough time per case for tens of iterations of the fast stages; a slow stage at N = 16384 gets
// one timed call, which keeps the whole grid within a few minutes on an H100.
constexpr double kMinTimeSeconds = 0.1;
// Leave room for the CUDA context, allocator granularity and fragmentation.
constexpr double kUsableFreeMemory = 0.9;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

harness::Problem make_problem(int seq, int head_dim, bool causal, flash::DType dtype) {
  harness::Problem p;
  p.batch = bench_grid::batch_for(seq);
  p.heads_q = p.heads_kv = dtype == flash::DType::kFp32 ? bench_grid::kFp32Heads : bench_grid::heads_for(head_dim);
  p.dtype = dtype;
  p.seq_q = p.seq_kv = seq;
  p.head_dim = head_dim;
  p.causal = causal;
  return p;
}

// Every grid point of one head_dim holds the same number of elements per tensor, and Google Benchmark calls a case
// several times while it settles on an iteration count; generating the inputs takes seconds, so
// they are made once and kept while the sizes stay the same.
const harness::DeviceInputs& inputs_for(const harness::Problem& p) {
  static std::unique_ptr<harness::DeviceInputs> cached;
  if (!cached || cached->dtype() != p.dtype || cached->q.size() != static_cast<size_t>(p.q_elems()) ||
      cached->k.size() != static_cast<size_t>(p.kv_elems())) {
    cached.reset();  // free the old inputs before allocating new ones
    cached = std::make_unique<harness::DeviceInputs>(harness::make_inputs(p, kSeed), p.dtype);
  }
  return *cached;
}

struct Event {
  cudaEvent_t event;
  Event() { harness::cuda_check(cudaEventCreate(&event), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(event); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// Times `call` once per benchmark iteration with CUDA events, after one untimed call that pays for
// module loading and cold caches. `before_each`, when given, runs before every timed call, outside
// the events. Returns the median in seconds, or 0 after skipping the case.
double time_iterations(benchmark::State& state, const std::function<flash::Status()>& call,
                       const std::function<void()>& before_each = {}) {
  flash::Status status = call();
  if (!status.ok()) {
    state.SkipWithError(flash::to_string(status).c_str());
    return 0;
  }
  harness::cuda_check(cudaDeviceSynchronize(), "warm-up");
  Event start, stop;
  std::vector<double> ms;
  for (auto _ : state) {
    if (before_each) before_each();
    harness::cuda_check(cudaEventRecord(start.event), "cudaEventRecord");
    status = call();
    harness::cuda_check(cudaEventRecord(stop.event), "cudaEventRecord");
    harness::cuda_check(cudaEventSynchronize(stop.event), "cudaEventSynchronize");
    if (!status.ok()) {
      state.SkipWithError(flash::to_string(status).c_str());
      return 0;
    }
    float elapsed_ms = 0.0f;
    harness::cuda_check(cudaEventElapsedTime(&elapsed_ms, start.event, stop.event), "cudaEventElapsedTime");
    ms.push_back(elapsed_ms);
    state.SetIterationTime(elapsed_ms / 1e3);
  }
  return ms.empty() ? 0 : median(ms) / 1e3;
}

// Skips the case (and returns false) when `bytes` more would not fit in free GPU memory.
bool fits(benchmark::State& state, size_t bytes) {
  size_t free_bytes = 0, total_bytes = 0;
  harness::cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (bytes <= kUsableFreeMemory * free_bytes) return true;
  char msg[160];
  std::snprintf(msg, sizeof msg, "%.1f GiB of buffers do not fit in %.1f GiB of free GPU memory", bytes / kGiB,
                free_bytes / kGiB);
  state.SkipWithError(msg);
  return false;
}

// Plain counters, not kIsRate: with manual time, benchmark's rates would divide by CPU time.
void report(benchmark::State& state, double seconds, double flops, double bytes, size_t workspace_bytes) {
  state.counters["median_ms"] = seconds * 1e3;
  state.counters["TFLOP/s"] = flops / seconds / 1e12;
  state.counters["GB/s"] = bytes / seconds / 1e9;
  state.counters["workspace_bytes"] = static_cast<double>(workspace_bytes);
}

void bench_forward(benchmark::State& state, const registry::Stage& stage, int head_dim, bool causal,
                   flash::DType dtype) {
  const harness::Problem p = make_problem(static_cast<int>(state.range(0)), head_dim, causal, dtype);
  try {
    const harness::DeviceInputs& in = inputs_for(p);
    const size_t workspace_bytes = stage.workspace_bytes(p);
    // The inputs are already on the device, so free memory has them counted out.
    if (!fits(state, workspace_bytes + p.q_elems() * flash::dtype_size(dtype) + p.rows() * sizeof(float))) return;
    harness::DeviceTensor o(dtype, static_cast<size_t>(p.q_elems()));
    harness::DeviceBuffer<float> lse(p.rows());
    harness::DeviceBuffer<unsigned char> workspace(workspace_bytes);
    const double seconds = time_iterations(state, [&] {
      return stage.forward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv,
                           p.seq_q, p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, p.dtype, workspace.get(),
                           workspace.bytes(), nullptr);
    });
    if (seconds > 0)
      report(state, seconds, harness::forward_flops(p), harness::forward_compulsory_bytes(p), workspace_bytes);
  } catch (const std::exception& e) {
    // A failed allocation or CUDA call skips this case; the next one may still fit.
    state.SkipWithError(e.what());
  }
}

// The backward alone: O and lse come from one forward call before timing starts. FLOPs are 2.5x
// the forward's (the FlashAttention convention: five matrix products instead of two), whatever
// the stage recomputes; the compulsory traffic reads Q, K, V, O, dO, lse and writes dQ, dK, dV.
// deterministic is passed to the backward (stage 11: the dQ pass without atomics).
void bench_backward(benchmark::State& state, const registry::Stage& stage, int head_dim, bool causal,
                    flash::DType dtype, bool deterministic) {
  const harness::Problem p = make_problem(static_cast<int>(state.range(0)), head_dim, causal, dtype);
  try {
    const harness::DeviceInputs& in = inputs_for(p);
    const size_t workspace_bytes = stage.backward_workspace_bytes(p);
    const size_t buffer_bytes = (2 * p.q_elems() + 2 * p.kv_elems()) * flash::dtype_size(dtype) + p.rows() * sizeof(float);
    if (!fits(state, workspace_bytes + buffer_bytes + stage.workspace_bytes(p))) return;
    harness::DeviceTensor o(dtype, static_cast<size_t>(p.q_elems())), dq(dtype, static_cast<size_t>(p.q_elems())),
        dk(dtype, static_cast<size_t>(p.kv_elems())), dv(dtype, static_cast<size_t>(p.kv_elems()));
    harness::DeviceBuffer<float> lse(p.rows());
    harness::DeviceBuffer<unsigned char> forward_workspace(stage.workspace_bytes(p)), workspace(workspace_bytes);
    const flash::Status status =
        stage.forward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv, p.seq_q,
                      p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, p.dtype, forward_workspace.get(),
                      forward_workspace.bytes(), nullptr);
    if (!status.ok()) {
      state.SkipWithError(flash::to_string(status).c_str());
      return;
    }
    const double seconds = time_iterations(state, [&] {
      return stage.backward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse.get(), in.d_out.get(), dq.get(),
                            dk.get(), dv.get(), p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim,
                            p.softmax_scale(), p.causal, p.dtype, deterministic, workspace.get(), workspace.bytes(),
                            nullptr);
    });
    const double bytes =
        harness::forward_compulsory_bytes(p) + (2.0 * p.q_elems() + 2.0 * p.kv_elems()) * flash::dtype_size(dtype);
    if (seconds > 0) report(state, seconds, 2.5 * harness::forward_flops(p), bytes, workspace_bytes);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding (stage 13): bandwidth over the K and V bytes
// ---------------------------------------------------------------------------------------------

// The decode problem stage 13 is measured on: one new query, 32 query heads sharing 8 K/V heads, head_dim 128.
constexpr int kDecodeHeadsQ = 32;
constexpr int kDecodeHeadsKv = 8;
constexpr int kDecodeHeadDim = 128;
constexpr int kDecodeSeqQ = 1;
constexpr int kDecodePageSize = 64;
// (batch, seq_kv): the three target shapes (lesson 13), then cache lengths at batch 1.
const std::vector<std::pair<int, int>> kDecodeShapes = {{1, 131072}, {8, 32768}, {64, 4096}};
const std::vector<int> kDecodeSweep = {1024, 4096, 16384, 65536, 262144, 1 << 20};

// time_iterations with L2 flushed before each call (outside the timed events).
double time_cold_iterations(benchmark::State& state, const std::function<flash::Status()>& call) {
  static const bench::L2Flush flush;
  return time_iterations(state, call, [] { flush(); });
}

// One decode call of the stage, contiguous or paged (pages of kDecodePageSize keys, sequence b's pages
// in a shuffled order across the cache, as an allocator that serves many sequences leaves them). The
// inputs are bytes 0x3C: finite in bf16 and fp16, and the time of a memory-bound kernel does not
// depend on the values (the tests check the results).
void bench_decode(benchmark::State& state, const registry::Stage& stage, flash::DType dtype, bool paged) {
  harness::Problem p;
  p.batch = static_cast<int>(state.range(0));
  p.seq_kv = static_cast<int>(state.range(1));
  p.heads_q = kDecodeHeadsQ;
  p.heads_kv = kDecodeHeadsKv;
  p.seq_q = kDecodeSeqQ;
  p.head_dim = kDecodeHeadDim;
  p.dtype = dtype;
  try {
    const int pages_per_seq = (p.seq_kv + kDecodePageSize - 1) / kDecodePageSize;
    const size_t kv_elems =
        paged ? static_cast<size_t>(p.batch) * pages_per_seq * kDecodePageSize * p.heads_kv * p.head_dim
              : static_cast<size_t>(p.kv_elems());
    const size_t workspace_bytes =
        paged ? stage.forward_paged_workspace_size(p.batch, p.heads_q, p.heads_kv, p.seq_q, p.head_dim,
                                                   kDecodePageSize, pages_per_seq)
              : stage.workspace_bytes(p);
    const size_t bytes = 2 * kv_elems * flash::dtype_size(dtype) + 2 * p.q_elems() * flash::dtype_size(dtype) +
                         workspace_bytes + p.rows() * sizeof(float);
    if (!fits(state, bytes)) return;
    harness::DeviceTensor q(dtype, static_cast<size_t>(p.q_elems())), k(dtype, kv_elems), v(dtype, kv_elems),
        o(dtype, static_cast<size_t>(p.q_elems()));
    for (const harness::DeviceTensor* t : {&q, &k, &v})
      harness::cuda_check(cudaMemset(t->get(), 0x3C, t->bytes.bytes()), "cudaMemset");
    harness::DeviceBuffer<float> lse(p.rows());
    harness::DeviceBuffer<unsigned char> workspace(workspace_bytes);
    harness::DeviceBuffer<int> table, lens;
    if (paged) {
      std::vector<int> order(static_cast<size_t>(p.batch) * pages_per_seq);
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      std::shuffle(order.begin(), order.end(), std::mt19937(kSeed));
      table = harness::DeviceBuffer<int>(order);
      lens = harness::DeviceBuffer<int>(std::vector<int>(p.batch, p.seq_kv));
    }
    const int num_pages = p.batch * pages_per_seq;
    const double seconds = time_cold_iterations(state, [&] {
      if (paged)
        return stage.forward_paged(q.get(), k.get(), v.get(), table.get(), lens.get(), o.get(), lse.get(), p.batch,
                                   p.heads_q, p.heads_kv, p.seq_q, p.head_dim, kDecodePageSize, num_pages,
                                   pages_per_seq, p.softmax_scale(), false, dtype, workspace.get(),
                                   workspace.bytes(), nullptr);
      return stage.forward(q.get(), k.get(), v.get(), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv, p.seq_q,
                           p.seq_kv, p.head_dim, p.softmax_scale(), false, dtype, workspace.get(), workspace.bytes(),
                           nullptr);
    });
    if (seconds <= 0) return;
    // The bytes that count: K and V of every sequence's seq_kv keys, read once.
    const double kv_bytes = 2.0 * p.kv_elems() * flash::dtype_size(dtype);
    report(state, seconds, harness::forward_flops(p), kv_bytes, workspace_bytes);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Names: stage13_decoding/bf16/decode/d128/h32kv8/batch:1/seq_kv:131072, and .../decode_paged64/... .
void register_decode_benchmarks(const registry::Stage& stage) {
  const flash::DType dtype = stage.dtypes.front();
  for (bool paged : {false, true}) {
    if (paged && !stage.forward_paged) continue;
    const std::string name = std::string("stage") + stage.folder + "/" + flash::dtype_name(dtype) +
                             (paged ? "/decode_paged" + std::to_string(kDecodePageSize) : std::string("/decode")) +
                             "/d" + std::to_string(kDecodeHeadDim) + "/h" + std::to_string(kDecodeHeadsQ) + "kv" +
                             std::to_string(kDecodeHeadsKv);
    benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(
        name.c_str(), [&stage, dtype, paged](benchmark::State& state) { bench_decode(state, stage, dtype, paged); });
    b->ArgNames({"batch", "seq_kv"})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(kMinTimeSeconds);
    for (const auto& [batch, seq_kv] : kDecodeShapes) b->Args({batch, seq_kv});
    if (paged) continue;  // the paged cache at the three shapes only
    for (int seq_kv : kDecodeSweep)
      if (seq_kv != kDecodeShapes.front().second) b->Args({1, seq_kv});
  }
}

void register_benchmarks(bool with_exercises) {
  std::vector<const registry::Stage*> entries;
  for (const registry::Stage& s : registry::stages()) entries.push_back(&s);
  if (with_exercises)
    for (const registry::Stage& s : registry::exercises()) entries.push_back(&s);
  for (const registry::Stage* entry : entries) {
    const registry::Stage& stage = *entry;
    if (stage.max_seq_q != 0) {  // a decoding stage: decode shapes, not the prefill grid
      register_decode_benchmarks(stage);
      continue;
    }
    for (flash::DType dtype : stage.dtypes) {
      for (int head_dim : kHeadDims) {
        for (bool causal : {false, true}) {
          // Every N shares head_dim and causal, so the first grid point decides support.
          if (!stage.supports(make_problem(kSeqLens.front(), head_dim, causal, dtype))) continue;
          // fp32 families keep their names (stage05_warp_shuffle/d64/causal0); half ones name the dtype.
          const std::string dtype_part =
              dtype == flash::DType::kFp32 ? "" : std::string("/") + flash::dtype_name(dtype);
          const std::string name = std::string(stage.is_exercise() ? "exercise" : "stage") + stage.folder +
                                   dtype_part + "/d" + std::to_string(head_dim) + "/causal" + (causal ? "1" : "0");
          benchmark::internal::Benchmark* b = benchmark::RegisterBenchmark(
              name.c_str(), [&stage, head_dim, causal, dtype](benchmark::State& state) {
                bench_forward(state, stage, head_dim, causal, dtype);
              });
          b->ArgName("seq")->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(kMinTimeSeconds);
          for (int seq : kSeqLens) b->Arg(seq);
          if (!stage.backward) continue;
          // .../backward; where the default mode sums with atomics, also .../backward_deterministic.
          for (bool deterministic : {false, true}) {
            if (deterministic && !stage.backward_atomic) continue;
            benchmark::internal::Benchmark* bwd = benchmark::RegisterBenchmark(
                (name + (deterministic ? "/backward_deterministic" : "/backward")).c_str(),
                [&stage, head_dim, causal, dtype, deterministic](benchmark::State& state) {
                  bench_backward(state, stage, head_dim, causal, dtype, deterministic);
                });
            bwd->ArgName("seq")->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(kMinTimeSeconds);
            for (int seq : kSeqLens) bwd->Arg(seq);
          }
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::string why;
  if (!harness::gpu_available(&why)) {
    std::fprintf(stderr, "flash-stages-bench: %s; the stages need an NVIDIA GPU to run.\n", why.c_str());
    return kExitNoGpu;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) benchmark::AddCustomContext("gpu", prop.name);
  register_benchmarks(benchmark::GetBenchmarkFilter().find("exercise") != std::string::npos);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

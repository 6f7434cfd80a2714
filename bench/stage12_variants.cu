// stage12-variants: stage 12's ladder (bench/stage12_ladder/: one consumer warpgroup in order, then
// one piece at a time up to the configuration the registered stage runs), timed side by side on the
// benchmark grid (bench_grid.h) in bf16 and fp16, with stage 10 as built for reference. Lesson 12's
// table "each piece switched on" comes from this program's output.
//
// --check instead checks the ladder: its last rung against stage12::forward, bit for bit (O and lse),
// on shapes that reach every path of the stage (odd lengths, GQA, the 160-key tiles, the causal tail,
// many heads at N = 4096); then every rung against the fp64 reference (FlashAttention's half-precision
// rule) and against stage 10 (the agreement tolerance), and against the first rung, on shapes that
// reach each rung's paths. Outputs are poisoned with NaN first (registry::run_forward).
//
// Needs a Hopper GPU (compute capability 9.0) and a build with stage 12's sm_90a code.
//
//   build/bin/stage12-variants [--json] [--dtype bf16|fp16] [--head-dim 64|128] [--seq N]
//   build/bin/stage12-variants --check [--dtype bf16|fp16] [--head-dim 64|128] [--rung R] [--small]
// (--dtype and --head-dim keep one part of the grid or of the checks: the inputs of each shape are made
// on the host, which takes most of the program's time; --seq times one sequence length, any N >= 1,
// instead of 1024, 4096 and 16384. --rung R checks rung R alone against the reference and stage 10,
// --small on the smallest shapes only: what compute-sanitizer can run.)
// Exit status: 0 timed or passed, 1 a check failed, 2 no Hopper GPU (or no sm_90a code), 3 usage.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "12_hopper/hopper.h"
#include "bench_grid.h"
#include "harness.h"
#include "ladder.h"
#include "reference.h"
#include "registry.h"

namespace {

using stage12_ladder::Variant;

constexpr int kExitFailed = 1;
constexpr int kExitNoGpu = 2;  // no GPU, not a Hopper GPU, or a build without stage 12's sm_90a code
constexpr int kExitUsage = 3;  // an option it does not know (the runner's code for the same)
constexpr int kWarmup = 2;
constexpr int kRuns = 4;  // timed runs per round
// Interleaved rounds (harness::time_cuda_interleaved), each in its own order, the median round
// reported: as many as there are launches (stage 10 and every rung), so that each launch follows
// many others.
constexpr int kRounds = stage12_ladder::kVariantCount + 1;
// The sequence lengths timed: three of the grid's, short, middle and long.
const std::vector<int> kTimedSeqs = {1024, 4096, 16384};

// The checks, as tests/test_stages_gpu.cpp holds the stages to them.
constexpr uint64_t kCheckSeed = 12;
constexpr double kHalfLseTolerance = 1e-4;
constexpr double kReferenceMacs = 1 << 26;  // host work per case for the fp64 reference

struct Options {
  bool json = false, check = false, small = false;
  const char* only_dtype = nullptr;
  int only_head_dim = 0;
  int only_rung = -1;
  std::vector<int> seqs = kTimedSeqs;
};

bool kept(const Options& opt, flash::DType dtype, int head_dim) {
  return (!opt.only_dtype || std::strcmp(opt.only_dtype, flash::dtype_name(dtype)) == 0) &&
         (opt.only_head_dim == 0 || opt.only_head_dim == head_dim);
}

// One rung's forward in the registry's signature, so that registry::run_forward runs it.
template <Variant kVariant>
flash::Status rung_forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                           int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal,
                           flash::DType dtype, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return stage12_ladder::forward_variant(kVariant, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                                         scale, causal, dtype, workspace, workspace_bytes, stream);
}

template <int... kIndices>
registry::ForwardFn rung_fn_of(int v, std::integer_sequence<int, kIndices...>) {
  registry::ForwardFn fns[] = {rung_forward<static_cast<Variant>(kIndices)>...};
  return fns[v];
}

// Rung v as registry stage 12 with its forward replaced.
registry::Stage rung_stage(int v) {
  registry::Stage s = *registry::find(12);
  s.forward = rung_fn_of(v, std::make_integer_sequence<int, stage12_ladder::kVariantCount>{});
  return s;
}

// Both vectors the same, bit for bit (the outputs came back as floats converted exactly from 16 bits).
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct Case {
  int rung;
  harness::Problem problem;
};

// Every shape of a list in both dtypes, at both head_dims, causal and not, for one rung.
template <size_t kN>
void add_cases(std::vector<Case>& cases, int rung, const int (&shapes)[kN][5]) {
  for (flash::DType dtype : {flash::DType::kBf16, flash::DType::kFp16})
    for (int head_dim : {64, 128})
      for (const auto& s : shapes)
        for (bool causal : {false, true}) {
          harness::Problem p{s[0], s[1], s[2], s[3], s[4], head_dim, causal};
          p.dtype = dtype;
          cases.push_back({rung, p});
        }
}

// The shapes the last rung and the stage must agree on bit for bit: {batch, heads_q, heads_kv, seq_q, seq_kv}.
const int kBitwiseShapes[][5] = {
    {1, 1, 1, 1, 1},        // one row, one key
    {1, 4, 4, 1000, 777},   // lengths that are not multiples of any tile; causal rows that see no key
    {2, 8, 2, 129, 63},     // GQA, seq_q > seq_kv, a half-empty second consumer
    {4, 40, 8, 300, 257},   // more work tiles than SMs, GQA; causal: pairs and the tail
    {1, 2, 1, 257, 4133},   // head_dim 64 causal: 160-key tiles, the last partial
    {1, 8, 2, 8192, 8192},  // causal: 160-key tiles at head_dim 64, 32 pairs a head and the tail
    {2, 32, 32, 4096, 4096},  // many heads at N = 4096: causal pairs head by head at 64 heads
};

// The shapes each rung is held to the reference on (the variant tests of the stage's development).
std::vector<Case> reference_cases(bool small) {
  const int shapes[][5] = {
      {1, 1, 1, 1, 1},        // one row, one key
      {1, 2, 2, 64, 128},     // exactly one query tile of the in-order kernel, one K/V tile
      {2, 3, 3, 17, 1000},    // short query tile, 8 K/V tiles, the last one partial
      {2, 8, 2, 129, 63},     // GQA, seq_q > seq_kv: causal rows that see no key; a half-empty second consumer
      {1, 4, 1, 200, 200},    // MQA
      {1, 2, 2, 1000, 1024},  // many tiles through the ring, both consumers busy
      {2, 4, 2, 65, 2},       // two keys a row: lse's error is largest where it sums few terms
  };
  std::vector<Case> cases;
  for (int v = 1; v < stage12_ladder::kVariantCount; ++v) add_cases(cases, v, shapes);
  if (small) return cases;
  // Persistent blocks: more work tiles than an H100 has SMs, so that blocks take several in turn
  // (the ring and Q carried over, odd and even tile counts), and causal work tiles that see no key
  // (seq_q > seq_kv) between tiles that do. In pairs, 3 query tiles a head leave the middle one
  // without a partner. Back to back, the turns and O's store carry over those tiles too; stored
  // behind the scores, O's store moves into the next work tile, past the tiles that see no key; with
  // the leftover unmasked, 4 K/V tiles leave one after the pairs, unmasked. With single tiles after
  // the pairs (causal; on an H100's 132 SMs), 66 of the 160 heads of the first and third shape run
  // their tiles one at a time after the pairs of the others, 132 of the 144 of the second and fourth.
  const int many_tiles[][5] = {
      {4, 40, 8, 300, 257},   // 480 work tiles of 3 K/V tiles or fewer (causal)
      {3, 48, 48, 129, 63},   // 288 work tiles; causal: the first 66 rows of each head see no key
      {4, 40, 8, 400, 100},   // causal: query tiles 0 and 1 of each head see no key, each second in its pair
      {3, 48, 16, 256, 512},  // 288 work tiles of 4 K/V tiles, none masked when not causal
  };
  for (Variant v : {Variant::kPersistent, Variant::kTilePairs, Variant::kBackToBack, Variant::kStoreBehindScores,
                    Variant::kLeftoverUnmasked, Variant::kWideKeyTiles, Variant::kSinglesAfterPairs,
                    Variant::kPairsAtAnyHeadCount, Variant::kInOrderAtHeadDim64})
    add_cases(cases, static_cast<int>(v), many_tiles);
  // Pairs and the single tiles after them with an odd count of query tiles (causal): 140 heads of 5
  // query tiles, 3 units a head, 44 heads in the tail; at any head count, also 8 heads of 64 query
  // tiles, 32 pairs a head, 5 heads in the tail.
  const int tails[][5] = {
      {2, 70, 10, 640, 640},
      {1, 8, 2, 8192, 8192},
  };
  for (Variant v : {Variant::kSinglesAfterPairs, Variant::kPairsAtAnyHeadCount, Variant::kInOrderAtHeadDim64})
    add_cases(cases, static_cast<int>(v), tails);
  // 160 keys a K/V tile at head_dim 64, where seq_kv >= 2048 (causal: 4096); the shorter shapes above
  // take the 128-key kernel. At head_dim 128, the same shapes on 128 keys.
  const int long_keys[][5] = {
      {1, 2, 1, 257, 4133},    // GQA; 26 K/V tiles, the last partial (4133 = 25 * 160 + 133); causal, rows
                               // whose diagonal falls in one tile or across two
      {1, 1, 1, 300, 2240},    // 14 tiles of 160 keys: the last, after the pairs, unmasked when not causal
      {1, 140, 20, 16, 4100},  // 140 work tiles, more than an H100 has SMs, each of 26 K/V tiles
  };
  for (Variant v : {Variant::kWideKeyTiles, Variant::kInOrderAtHeadDim64})
    add_cases(cases, static_cast<int>(v), long_keys);
  // A negative scale (Q negated in shared memory, with its proxy fence) for every rung; a zero scale,
  // where every visible key weighs the same, masked tiles included.
  for (int v = 1; v < stage12_ladder::kVariantCount; ++v) {
    harness::Problem p{2, 4, 2, 129, 200, 128, true};
    p.dtype = flash::DType::kBf16;
    p.scale = -0.2f;
    cases.push_back({v, p});
    p.head_dim = 64;
    p.scale = 0.0f;
    cases.push_back({v, p});
  }
  return cases;
}

std::string describe(int rung, const harness::Problem& p) {
  return std::string("rung ") + std::to_string(rung) + " '" +
         stage12_ladder::variant_name(static_cast<Variant>(rung)) + "', " + p.describe() + ", scale " +
         std::to_string(p.softmax_scale());
}

// The last rung against stage12::forward: O and lse bit for bit. Returns the failures.
int check_bitwise(const Options& opt) {
  int failures = 0, cases = 0;
  const registry::Stage last = rung_stage(static_cast<int>(stage12_ladder::kLastVariant));
  const registry::Stage& stage = *registry::find(12);
  for (flash::DType dtype : {flash::DType::kBf16, flash::DType::kFp16})
    for (int head_dim : {64, 128})
      for (const auto& s : kBitwiseShapes)
        for (bool causal : {false, true}) {
          if (!kept(opt, dtype, head_dim)) continue;
          harness::Problem p{s[0], s[1], s[2], s[3], s[4], head_dim, causal};
          p.dtype = dtype;
          const harness::DeviceInputs in(harness::make_inputs(p, kCheckSeed), p.dtype);
          const registry::ForwardResult want = registry::run_forward(stage, p, in);
          const registry::ForwardResult got = registry::run_forward(last, p, in);
          ++cases;
          const char* why = !want.status.ok() || !got.status.ok() ? "a forward failed"
                            : harness::count_nonfinite(want.o) != 0 ? "non-finite output"
                            : !bitwise_equal(got.o, want.o)        ? "O differs"
                            : !bitwise_equal(got.lse, want.lse)    ? "lse differs"
                                                                   : nullptr;
          if (why) {
            ++failures;
            std::printf("FAIL bitwise: %s: %s (stage: %s; last rung: %s)\n",
                        describe(static_cast<int>(stage12_ladder::kLastVariant), p).c_str(), why,
                        flash::to_string(want.status).c_str(), flash::to_string(got.status).c_str());
          }
        }
  std::printf("last rung vs stage12::forward, bit for bit: %d of %d cases identical\n", cases - failures, cases);
  return failures;
}

// Each rung against the fp64 reference and stage 10. Returns the failures.
int check_reference(const Options& opt) {
  int failures = 0, cases = 0;
  for (const Case& c : reference_cases(opt.small)) {
    const harness::Problem& p = c.problem;
    if (!kept(opt, p.dtype, p.head_dim) || (opt.only_rung >= 0 && c.rung != opt.only_rung)) continue;
    ++cases;
    const harness::HostInputs host = harness::make_inputs(p, kCheckSeed);
    const registry::ForwardResult got = registry::run_forward(rung_stage(c.rung), p, host);
    std::string why;
    if (!got.status.ok()) {
      why = flash::to_string(got.status);
    } else {
      const long long max_rows =
          std::max(64LL, static_cast<long long>(kReferenceMacs / (2.0 * p.seq_kv * p.head_dim)));
      const std::vector<long long> rows = harness::sample_rows(p.rows(), max_rows);
      const reference::HalfPrecisionCheck check =
          reference::check_half_precision(p, host, rows, harness::gather_rows(got.o, rows, p.head_dim));
      const harness::ErrorStats lse_err = harness::compare(harness::gather_rows(got.lse, rows, 1), check.exact.lse);
      const registry::ForwardResult before = registry::run_forward(*registry::find(10), p, host);
      const double tolerance = harness::agreement_tolerance(p.dtype, p.dtype);
      if (harness::count_nonfinite(got.o) != 0)
        why = "unwritten or non-finite output";
      else if (!check.passes())
        why = "O vs reference: " + check.error.describe() + ", allowed max_abs " + std::to_string(check.bound);
      else if (!lse_err.within(kHalfLseTolerance))
        why = "lse vs reference: " + lse_err.describe();
      else if (!before.status.ok())
        why = "stage 10: " + flash::to_string(before.status);
      else if (const harness::ErrorStats e = harness::compare(got.o, before.o); !e.within(tolerance))
        why = "O vs stage 10: " + e.describe() + " (allowed " + std::to_string(tolerance) + ")";
    }
    if (!why.empty()) {
      ++failures;
      std::printf("FAIL reference: %s: %s\n", describe(c.rung, p).c_str(), why.c_str());
    }
  }
  std::printf("every rung vs the fp64 reference and stage 10: %d of %d cases pass\n", cases - failures, cases);
  return failures;
}

// The rungs are the same function: on the same inputs each agrees with the first to rounding (their
// sums run in other orders only where the overlapped loop regroups them; the products are the same
// wgmma). Returns the failures.
int check_rungs_agree(const Options& opt) {
  harness::Problem p{2, 8, 2, 1000, 1024, 128, true};
  p.dtype = flash::DType::kBf16;
  if (!kept(opt, p.dtype, p.head_dim) || opt.small || opt.only_rung >= 0) return 0;
  const harness::HostInputs host = harness::make_inputs(p, kCheckSeed);
  const registry::ForwardResult base = registry::run_forward(rung_stage(static_cast<int>(Variant::kOneConsumer)), p, host);
  int failures = base.status.ok() ? 0 : 1;
  for (int v = 2; v < stage12_ladder::kVariantCount && base.status.ok(); ++v) {
    const registry::ForwardResult got = registry::run_forward(rung_stage(v), p, host);
    const harness::ErrorStats err = harness::compare(got.o, base.o);
    if (!got.status.ok() || !err.within(harness::agreement_tolerance(p.dtype, p.dtype))) {
      ++failures;
      std::printf("FAIL agreement: %s vs rung 1: %s\n", describe(v, p).c_str(),
                  got.status.ok() ? err.describe().c_str() : flash::to_string(got.status).c_str());
    }
  }
  std::printf("every rung vs rung 1 on one shape: %s\n", failures == 0 ? "agree" : "FAILED");
  return failures;
}

int run_checks(const Options& opt) {
  int failures = 0;
  if (opt.only_rung < 0) failures += check_bitwise(opt);
  failures += check_reference(opt);
  failures += check_rungs_agree(opt);
  std::printf("stage12-variants --check: %s\n", failures == 0 ? "passed" : "FAILED");
  return failures == 0 ? 0 : kExitFailed;
}

int run_timings(const Options& opt) {
  if (opt.json) std::printf("[\n");
  bool first = true;
  for (flash::DType dtype : {flash::DType::kBf16, flash::DType::kFp16})
    for (int head_dim : bench_grid::head_dims())
      for (bool causal : {false, true})
        for (int seq : opt.seqs) {
          if (!kept(opt, dtype, head_dim)) continue;
          harness::Problem p;
          p.batch = bench_grid::batch_for(seq);
          p.heads_q = p.heads_kv = bench_grid::heads_for(head_dim);
          p.seq_q = p.seq_kv = seq;
          p.head_dim = head_dim;
          p.causal = causal;
          p.dtype = dtype;
          const harness::DeviceInputs in(harness::make_inputs(p, bench_grid::kSeed), p.dtype);
          harness::DeviceTensor o(p.dtype, static_cast<size_t>(p.q_elems()));
          harness::DeviceBuffer<float> lse(p.rows());
          // -1: stage 10 as built; then every rung of the ladder, kRegistered ("as built") first.
          constexpr int kFirst = -1;
          std::vector<flash::Status> statuses(stage12_ladder::kVariantCount - kFirst);
          std::vector<std::function<void()>> launches;
          for (int v = kFirst; v < stage12_ladder::kVariantCount; ++v)
            launches.push_back([&, v] {
              flash::Status& status = statuses[v - kFirst];
              if (v < 0)
                status = registry::find(10)->forward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse.get(), p.batch,
                                                     p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim,
                                                     p.softmax_scale(), p.causal, p.dtype, nullptr, 0, nullptr);
              else
                status = stage12_ladder::forward_variant(static_cast<Variant>(v), in.q.get(), in.k.get(), in.v.get(),
                                                         o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv, p.seq_q,
                                                         p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, p.dtype,
                                                         nullptr, 0, nullptr);
            });
          const std::vector<harness::Timing> timings =
              harness::time_cuda_interleaved(launches, kWarmup, kRuns, kRounds);
          for (int v = kFirst; v < stage12_ladder::kVariantCount; ++v) {
            const char* name = v < 0 ? "stage 10 as built" : stage12_ladder::variant_name(static_cast<Variant>(v));
            const flash::Status& status = statuses[v - kFirst];
            const harness::Timing& t = timings[v - kFirst];
            const double tflops = status.ok() ? harness::forward_flops(p) / (t.median_ms * 1e-3) / 1e12 : 0.0;
            if (opt.json) {
              std::printf("%s {\"dtype\": \"%s\", \"head_dim\": %d, \"causal\": %s, \"seq\": %d, \"variant\": \"%s\", "
                          "\"ms\": %.5g, \"tflops\": %.4g, \"status\": \"%s\"}\n",
                          first ? " " : ",", flash::dtype_name(dtype), head_dim, causal ? "true" : "false", seq, name,
                          t.median_ms, tflops, flash::to_string(status).c_str());
            } else {
              std::printf("%s d%-4d causal=%d N=%-6d %-36s %8.3f ms %7.1f TFLOP/s %s\n", flash::dtype_name(dtype),
                          head_dim, causal ? 1 : 0, seq, name, t.median_ms, tflops,
                          status.ok() ? "" : flash::to_string(status).c_str());
            }
            first = false;
          }
        }
  if (opt.json) std::printf("]\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      opt.json = true;
    } else if (std::strcmp(argv[i], "--check") == 0) {
      opt.check = true;
    } else if (std::strcmp(argv[i], "--small") == 0) {
      opt.small = true;
    } else if (std::strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
      opt.only_dtype = argv[++i];
    } else if (std::strcmp(argv[i], "--head-dim") == 0 && i + 1 < argc) {
      opt.only_head_dim = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--rung") == 0 && i + 1 < argc && std::atoi(argv[i + 1]) >= 1 &&
               std::atoi(argv[i + 1]) < stage12_ladder::kVariantCount) {
      opt.only_rung = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--seq") == 0 && i + 1 < argc && std::atoi(argv[i + 1]) >= 1) {
      opt.seqs = {std::atoi(argv[++i])};
    } else {
      std::fprintf(stderr,
                   "usage: stage12-variants [--json] [--dtype bf16|fp16] [--head-dim 64|128] [--seq N]\n"
                   "       stage12-variants --check [--dtype bf16|fp16] [--head-dim 64|128] [--rung R] [--small]\n");
      return kExitUsage;
    }
  }
  std::string why;
  if (!harness::gpu_available(&why)) {
    std::fprintf(stderr, "stage12-variants: no Hopper GPU: %s\n", why.c_str());
    return kExitNoGpu;
  }
  const flash::Status arch = stage12::check_gpu();
  if (!arch.ok()) {
    std::fprintf(stderr, "stage12-variants: no Hopper GPU: %s\n", flash::to_string(arch).c_str());
    return kExitNoGpu;
  }
  return opt.check ? run_checks(opt) : run_timings(opt);
}

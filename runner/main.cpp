// flash-stages: the course runner. Runs every stage on one problem, checks each against the stage
// before it and against the fp64 reference, and prints what each idea bought.
//
//   flash-stages [--stage N] [--batch B] [--heads H] [--heads-kv H] [--seq N] [--seq-q N]
//                [--seq-kv N] [--head-dim D] [--causal] [--dtype fp32|fp16|bf16] [--runs R] [--json] [--list]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "reference.h"
#include "registry.h"

namespace {

constexpr int kExitNoGpu = 2;  // distinct from 1 (a stage failed) so scripts can tell them apart
constexpr int kExitUsage = 3;
constexpr uint64_t kSeed = 2024;
// Relative L2 error a correct fp32 stage stays under against fp64 (rounding of N-term sums).
constexpr double kFp32Tolerance = 1e-5;
// Relative L2 distance allowed from the previous stage when the coarser of the two rounds to bf16 or
// fp16 (as tests/test_stages_gpu.cpp's agreement_tolerance, which explains the figures).
constexpr double kBf16Agreement = 1e-2;
constexpr double kFp16Agreement = 2e-3;
// The reference costs rows * seq_kv * head_dim * 4 flops in fp64 on the host; this many rows keep
// it to a second or two while still sampling every head.
constexpr long long kReferenceRows = 2048;

struct Options {
  harness::Problem problem;
  int stage = 0;  // 0: all
  int runs = 20;
  bool json = false;
  bool dtype_given = false;  // false: each stage in its first dtype
  flash::DType dtype = flash::DType::kFp32;
};

// The dtype spelled as the registry spells it, or false.
bool parse_dtype(const std::string& name, flash::DType* dtype) {
  for (flash::DType d : {flash::DType::kFp32, flash::DType::kFp16, flash::DType::kBf16})
    if (name == flash::dtype_name(d)) {
      *dtype = d;
      return true;
    }
  return false;
}

double agreement_tolerance(flash::DType a, flash::DType b) {
  if (a == flash::DType::kBf16 || b == flash::DType::kBf16) return kBf16Agreement;
  if (a == flash::DType::kFp16 || b == flash::DType::kFp16) return kFp16Agreement;
  return kFp32Tolerance;
}

void usage() {
  std::fprintf(stderr,
               "usage: flash-stages [--stage N] [--batch B] [--heads H] [--heads-kv H] [--seq N] [--seq-q N]\n"
               "                    [--seq-kv N] [--head-dim D] [--causal] [--dtype fp32|fp16|bf16] [--runs R] [--json]\n"
               "                    [--list]\n"
               "Runs every stage (or one) on one problem, checks it against the previous stage and an fp64\n"
               "reference, and prints time, TFLOP/s and errors. Default problem: batch 4, heads 16, seq 1024,\n"
               "head_dim 64, not causal, each stage in its first dtype (--dtype: only the stages that have it).\n");
}

bool parse(int argc, char** argv, Options* opt) {
  harness::Problem& p = opt->problem;
  p.batch = 4;
  p.heads_q = 16;
  p.heads_kv = 0;  // 0: same as heads_q
  p.seq_q = p.seq_kv = 1024;
  p.head_dim = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](int* out) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      *out = static_cast<int>(v);
      return *end == '\0';
    };
    bool ok = true;
    if (a == "--stage") ok = value(&opt->stage);
    else if (a == "--batch") ok = value(&p.batch);
    else if (a == "--heads") ok = value(&p.heads_q);
    else if (a == "--heads-kv") ok = value(&p.heads_kv);
    else if (a == "--seq") { ok = value(&p.seq_q); p.seq_kv = p.seq_q; }
    else if (a == "--seq-q") ok = value(&p.seq_q);
    else if (a == "--seq-kv") ok = value(&p.seq_kv);
    else if (a == "--head-dim") ok = value(&p.head_dim);
    else if (a == "--runs") ok = value(&opt->runs);
    else if (a == "--causal") p.causal = true;
    else if (a == "--json") opt->json = true;
    else if (a == "--dtype") {
      ok = i + 1 < argc && parse_dtype(argv[i + 1], &opt->dtype);
      if (ok) ++i;
      opt->dtype_given = true;
    }
    else if (a == "--list") {
      for (const registry::Stage& s : registry::stages())
        std::printf("%02d  %-16s %-9s %s\n", s.number, s.name, s.dtype_list().c_str(), s.lesson);
      std::exit(0);
    }
    else if (a == "--help" || a == "-h") { usage(); std::exit(0); }
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "flash-stages: bad argument '%s'\n", a.c_str());
      return false;
    }
  }
  if (p.heads_kv == 0) p.heads_kv = p.heads_q;
  if (opt->runs < 1) {
    std::fprintf(stderr, "flash-stages: --runs must be >= 1\n");
    return false;
  }
  if (opt->stage != 0 && !registry::find(opt->stage)) {
    std::fprintf(stderr, "flash-stages: --stage %d: no such stage\n", opt->stage);
    return false;
  }
  return true;
}

struct Row {
  const registry::Stage* stage = nullptr;
  std::string status = "ok";  // "ok", or why it did not run
  double ms = 0, min_ms = 0, tflops = 0, speedup = 0;  // ms: median; min_ms shows the spread
  harness::ErrorStats vs_prev, vs_ref;
  int prev = 0;
  flash::DType dtype = flash::DType::kFp32;
  size_t workspace = 0;
  bool pass = false;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, &opt)) {
    usage();
    return kExitUsage;
  }
  std::string why;
  if (!harness::gpu_available(&why)) {
    std::printf("flash-stages: %s; the stages need an NVIDIA GPU to run.\n", why.c_str());
    return kExitNoGpu;
  }
  // Inputs, device copies and reference rows per dtype: a half stage reads inputs rounded to its
  // dtype, and the stage before it and the reference see exactly those numbers.
  struct DtypeData {
    harness::Problem problem;
    harness::HostInputs host;
    std::unique_ptr<harness::DeviceInputs> dev;
  };
  std::map<flash::DType, DtypeData> by_dtype;
  auto data_for = [&](flash::DType dtype) -> DtypeData& {
    auto it = by_dtype.find(dtype);
    if (it != by_dtype.end()) return it->second;
    DtypeData d;
    d.problem = opt.problem;
    d.problem.dtype = dtype;
    d.host = harness::make_inputs(d.problem, kSeed);
    d.dev = std::make_unique<harness::DeviceInputs>(d.host, dtype);
    return by_dtype.emplace(dtype, std::move(d)).first->second;
  };
  const std::vector<long long> ref_rows = harness::sample_rows(opt.problem.rows(), kReferenceRows);

  std::vector<Row> rows;
  double baseline_ms = 0;
  bool all_pass = true;
  for (const registry::Stage& s : registry::stages()) {
    const bool selected = opt.stage == 0 || s.number == opt.stage;
    if (!selected) continue;
    const flash::DType dtype = opt.dtype_given ? opt.dtype : s.dtypes.front();
    Row row;
    row.stage = &s;
    row.dtype = dtype;
    DtypeData& data = data_for(dtype);
    const harness::Problem& p = data.problem;
    row.workspace = s.workspace_bytes(p);
    if (!s.supports(p)) {
      row.status = "not supported";
    } else {
      size_t free_bytes = 0, total_bytes = 0;
      harness::cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      if (row.workspace > free_bytes / 2) {
        row.status = "workspace does not fit";
      } else {
        const registry::ForwardResult r = registry::run_forward(s, p, *data.dev);
        if (!r.status.ok()) {
          row.status = flash::to_string(r.status);
        } else {
          const std::vector<float> got = harness::gather_rows(r.o, ref_rows, p.head_dim);
          bool ref_ok = false;
          if (dtype == flash::DType::kFp32) {
            row.vs_ref = harness::compare(got, reference::forward_rows(p, data.host, ref_rows).o);
            ref_ok = row.vs_ref.within(kFp32Tolerance);
          } else {
            const reference::HalfPrecisionCheck check = reference::check_half_precision(p, data.host, ref_rows, got);
            row.vs_ref = check.error;
            ref_ok = check.passes();
          }
          double prev_tolerance = kFp32Tolerance;
          if (const registry::Stage* prev = registry::previous(s, p)) {
            // The previous stage on the same rounded inputs, in its own dtype when it lacks this one.
            const registry::ForwardResult before = registry::run_forward(*prev, p, data.host);
            if (before.status.ok()) {
              row.prev = prev->number;
              row.vs_prev = harness::compare(r.o, before.o);
              prev_tolerance = agreement_tolerance(dtype, prev->in_own_dtype(p).dtype);
            }
          }
          harness::DeviceTensor o(dtype, static_cast<size_t>(p.q_elems()));
          harness::DeviceBuffer<float> lse(p.rows());
          harness::DeviceBuffer<unsigned char> ws(row.workspace);
          const harness::DeviceInputs& dev = *data.dev;
          const harness::Timing t = harness::time_cuda(
              [&] {
                s.forward(dev.q.get(), dev.k.get(), dev.v.get(), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv,
                          p.seq_q, p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, p.dtype, ws.get(), ws.bytes(),
                          nullptr);
              },
              /*warmup=*/3, opt.runs);
          row.ms = t.median_ms;
          row.min_ms = t.min_ms;
          row.tflops = harness::forward_flops(p) / (t.median_ms * 1e-3) / 1e12;
          if (s.number == 1) baseline_ms = t.median_ms;
          row.speedup = baseline_ms > 0 ? baseline_ms / t.median_ms : 0;
          row.pass = ref_ok && (row.prev == 0 || row.vs_prev.within(prev_tolerance));
        }
      }
    }
    if (row.status == "ok" && !row.pass) all_pass = false;
    if (row.status != "ok" && row.status != "not supported" && row.status != "workspace does not fit") all_pass = false;
    rows.push_back(row);
  }

  const harness::Problem& p = opt.problem;
  if (opt.json) {
    std::printf("{\"problem\": {\"batch\": %d, \"heads_q\": %d, \"heads_kv\": %d, \"seq_q\": %d, \"seq_kv\": %d, "
                "\"head_dim\": %d, \"causal\": %s},\n \"stages\": [\n",
                p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim, p.causal ? "true" : "false");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("  {\"stage\": %d, \"name\": \"%s\", \"dtype\": \"%s\", \"status\": \"%s\", \"ms\": %.6g, \"min_ms\": %.6g, "
                  "\"runs\": %d, \"tflops\": %.6g, "
                  "\"speedup_vs_01\": %.6g, \"previous\": %d, \"rel_l2_vs_previous\": %.6g, "
                  "\"rel_l2_vs_reference\": %.6g, \"max_abs_vs_reference\": %.6g, \"workspace_bytes\": %zu, "
                  "\"pass\": %s}%s\n",
                  r.stage->number, r.stage->name, flash::dtype_name(r.dtype), r.status.c_str(), r.ms, r.min_ms, opt.runs, r.tflops, r.speedup, r.prev,
                  r.vs_prev.rel_l2, r.vs_ref.rel_l2, r.vs_ref.max_abs, r.workspace, r.pass ? "true" : "false",
                  i + 1 < rows.size() ? "," : "");
    }
    std::printf(" ]}\n");
  } else {
    cudaDeviceProp prop;
    harness::cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::string described = p.describe();  // the dtype is per stage, in its own column
    described = described.substr(0, described.rfind(" dtype="));
    std::printf("%s | %s | reference rows checked: %zu of %lld\n\n", prop.name, described.c_str(), ref_rows.size(),
                p.rows());
    std::printf("%-5s %-16s %-5s %10s %9s %9s %-18s %-12s %14s  %s\n", "stage", "name", "dtype", "time_ms", "TFLOP/s",
                "speedup", "err_vs_prev", "err_vs_ref", "workspace_B", "check");
    for (const Row& r : rows) {
      if (r.status != "ok") {
        std::printf("%-5d %-16s %-5s %s\n", r.stage->number, r.stage->name, flash::dtype_name(r.dtype), r.status.c_str());
        continue;
      }
      char prev[32] = "-";
      if (r.prev) std::snprintf(prev, sizeof prev, "%.1e (vs %02d)", r.vs_prev.rel_l2, r.prev);
      char speedup[16] = "-";  // stage 01 did not run (--stage N)
      if (r.speedup > 0) std::snprintf(speedup, sizeof speedup, "%.1fx", r.speedup);
      std::printf("%-5d %-16s %-5s %10.3f %9.2f %9s %-18s %-12.1e %14zu  %s\n", r.stage->number, r.stage->name,
                  flash::dtype_name(r.dtype), r.ms, r.tflops, speedup, prev, r.vs_ref.rel_l2, r.workspace, r.pass ? "PASS" : "FAIL");
    }
  }
  return all_pass ? 0 : 1;
}

// flash-stages: the course runner. Runs every stage on one problem, checks each against the stage
// before it and against the fp64 reference, and prints what each idea bought.
//
//   flash-stages [--stage N] [--batch B] [--heads H] [--heads-kv H] [--seq N] [--seq-q N]
//                [--seq-kv N] [--head-dim D] [--causal] [--dtype fp32] [--runs R] [--json] [--list]
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
// The reference costs rows * seq_kv * head_dim * 4 flops in fp64 on the host; this many rows keep
// it to a second or two while still sampling every head.
constexpr long long kReferenceRows = 2048;

struct Options {
  harness::Problem problem;
  int stage = 0;  // 0: all
  int runs = 20;
  bool json = false;
  std::string dtype = "fp32";
};

void usage() {
  std::fprintf(stderr,
               "usage: flash-stages [--stage N] [--batch B] [--heads H] [--heads-kv H] [--seq N] [--seq-q N]\n"
               "                    [--seq-kv N] [--head-dim D] [--causal] [--dtype fp32] [--runs R] [--json] [--list]\n"
               "Runs every stage (or one) on one problem, checks it against the previous stage and an fp64\n"
               "reference, and prints time, TFLOP/s and errors. Default problem: batch 4, heads 16, seq 1024,\n"
               "head_dim 64, not causal.\n");
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
    else if (a == "--dtype" && i + 1 < argc) opt->dtype = argv[++i];
    else if (a == "--list") {
      for (const registry::Stage& s : registry::stages()) std::printf("%02d  %-16s %s\n", s.number, s.name, s.lesson);
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
  if (opt->dtype != "fp32") {
    std::fprintf(stderr, "flash-stages: --dtype %s: no stage supports it yet (fp32 only)\n", opt->dtype.c_str());
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
  const harness::Problem& p = opt.problem;
  const harness::HostInputs host = harness::make_inputs(p, kSeed);
  const harness::DeviceInputs dev(host);

  const std::vector<long long> ref_rows = harness::sample_rows(p.rows(), kReferenceRows);
  const reference::ForwardRows ref = reference::forward_rows(p, host, ref_rows);

  std::vector<Row> rows;
  std::vector<std::vector<float>> outputs(registry::stages().size());
  double baseline_ms = 0;
  bool all_pass = true;
  for (size_t idx = 0; idx < registry::stages().size(); ++idx) {
    const registry::Stage& s = registry::stages()[idx];
    const bool selected = opt.stage == 0 || s.number == opt.stage;
    const registry::Stage* prev = registry::previous(s, p);
    // The previous stage runs too when only one stage is asked for, so it can be compared.
    const bool needed_as_prev = opt.stage != 0 && registry::find(opt.stage) &&
                                registry::previous(*registry::find(opt.stage), p) == &s;
    if (!selected && !needed_as_prev) continue;
    Row row;
    row.stage = &s;
    row.workspace = s.workspace_bytes(p);
    if (!s.supports(p)) {
      row.status = "not supported";
    } else {
      size_t free_bytes = 0, total_bytes = 0;
      harness::cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      if (row.workspace > free_bytes / 2) {
        row.status = "workspace does not fit";
      } else {
        const registry::ForwardResult r = registry::run_forward(s, p, dev);
        if (!r.status.ok()) {
          row.status = flash::to_string(r.status);
        } else {
          outputs[idx] = r.o;
          row.vs_ref = harness::compare(harness::gather_rows(r.o, ref_rows, p.head_dim), ref.o);
          if (prev && !outputs[prev - &registry::stages()[0]].empty()) {
            row.prev = prev->number;
            row.vs_prev = harness::compare(r.o, outputs[prev - &registry::stages()[0]]);
          }
          harness::DeviceBuffer<float> o(p.q_elems()), lse(p.rows());
          harness::DeviceBuffer<unsigned char> ws(row.workspace);
          const harness::Timing t = harness::time_cuda(
              [&] {
                s.forward(dev.q.get(), dev.k.get(), dev.v.get(), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv,
                          p.seq_q, p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, ws.get(), ws.bytes(), nullptr);
              },
              /*warmup=*/3, opt.runs);
          row.ms = t.median_ms;
          row.min_ms = t.min_ms;
          row.tflops = harness::forward_flops(p) / (t.median_ms * 1e-3) / 1e12;
          if (s.number == 1) baseline_ms = t.median_ms;
          row.speedup = baseline_ms > 0 ? baseline_ms / t.median_ms : 0;
          row.pass = row.vs_ref.within(kFp32Tolerance) && (row.prev == 0 || row.vs_prev.within(kFp32Tolerance));
        }
      }
    }
    if (selected && row.status == "ok" && !row.pass) all_pass = false;
    if (selected && row.status != "ok" && row.status != "not supported" && row.status != "workspace does not fit")
      all_pass = false;
    if (selected) rows.push_back(row);
  }

  if (opt.json) {
    std::printf("{\"problem\": {\"batch\": %d, \"heads_q\": %d, \"heads_kv\": %d, \"seq_q\": %d, \"seq_kv\": %d, "
                "\"head_dim\": %d, \"causal\": %s, \"dtype\": \"%s\"},\n \"stages\": [\n",
                p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim, p.causal ? "true" : "false",
                opt.dtype.c_str());
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("  {\"stage\": %d, \"name\": \"%s\", \"status\": \"%s\", \"ms\": %.6g, \"min_ms\": %.6g, "
                  "\"runs\": %d, \"tflops\": %.6g, "
                  "\"speedup_vs_01\": %.6g, \"previous\": %d, \"rel_l2_vs_previous\": %.6g, "
                  "\"rel_l2_vs_reference\": %.6g, \"max_abs_vs_reference\": %.6g, \"workspace_bytes\": %zu, "
                  "\"pass\": %s}%s\n",
                  r.stage->number, r.stage->name, r.status.c_str(), r.ms, r.min_ms, opt.runs, r.tflops, r.speedup, r.prev,
                  r.vs_prev.rel_l2, r.vs_ref.rel_l2, r.vs_ref.max_abs, r.workspace, r.pass ? "true" : "false",
                  i + 1 < rows.size() ? "," : "");
    }
    std::printf(" ]}\n");
  } else {
    cudaDeviceProp prop;
    harness::cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::printf("%s | %s | fp32 | reference rows checked: %zu of %lld\n\n", prop.name, p.describe().c_str(),
                ref_rows.size(), p.rows());
    std::printf("%-5s %-16s %10s %9s %9s %-18s %-12s %14s  %s\n", "stage", "name", "time_ms", "TFLOP/s", "speedup",
                "err_vs_prev", "err_vs_ref", "workspace_B", "check");
    for (const Row& r : rows) {
      if (r.status != "ok") {
        std::printf("%-5d %-16s %s\n", r.stage->number, r.stage->name, r.status.c_str());
        continue;
      }
      char prev[32] = "-";
      if (r.prev) std::snprintf(prev, sizeof prev, "%.1e (vs %02d)", r.vs_prev.rel_l2, r.prev);
      char speedup[16] = "-";  // stage 01 did not run (--stage N)
      if (r.speedup > 0) std::snprintf(speedup, sizeof speedup, "%.1fx", r.speedup);
      std::printf("%-5d %-16s %10.3f %9.2f %9s %-18s %-12.1e %14zu  %s\n", r.stage->number, r.stage->name, r.ms,
                  r.tflops, speedup, prev, r.vs_ref.rel_l2, r.workspace, r.pass ? "PASS" : "FAIL");
    }
  }
  return all_pass ? 0 : 1;
}

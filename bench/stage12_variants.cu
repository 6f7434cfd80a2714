// stage12-variants: stage 12's kernel one piece at a time (stage12::Variant: version A, then two
// consumer warpgroups, setmaxnreg, ping-pong, intra-warpgroup overlap = version B), timed side by side
// on the FlashAttention grid (B * N = 16384 tokens, H * d = 2048) in bf16 and fp16, with stage 10 as
// built for reference. Lesson 12's table "each piece switched on" comes from this program's output.
// Needs a Hopper GPU (compute capability 9.0) and a build with stage 12's sm_90a code.
//
//   build/bin/stage12-variants [--json] [--dtype bf16|fp16] [--head-dim 64|128] [--seq N]
// (--dtype and --head-dim keep one part of the grid: the inputs of each shape are made on the host,
// which takes most of the program's time; --seq times one sequence length, any N >= 1, instead of
// 1024, 4096 and 16384.)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "12_hopper/hopper.h"
#include "harness.h"
#include "registry.h"

namespace {

constexpr int kExitNoGpu = 2;  // no GPU, not a Hopper GPU, or a build without stage 12's sm_90a code
constexpr int kExitUsage = 3;  // an option it does not know (the runner's code for the same)
constexpr uint64_t kSeed = 2024;
constexpr int kTokens = 16384;
constexpr int kHeadsTimesDim = 2048;
constexpr int kWarmup = 2;
constexpr int kRuns = 4;  // timed runs per round
// Interleaved rounds (harness::time_cuda_interleaved), each in its own order, the median round
// reported: as many as there are launches (stage 10 and every variant), so that each launch follows
// many others.
constexpr int kRounds = stage12::kVariantCount + 1;

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  const char* only_dtype = nullptr;
  int only_head_dim = 0;
  std::vector<int> seqs = {1024, 4096, 16384};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
      only_dtype = argv[++i];
    } else if (std::strcmp(argv[i], "--head-dim") == 0 && i + 1 < argc) {
      only_head_dim = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--seq") == 0 && i + 1 < argc && std::atoi(argv[i + 1]) >= 1) {
      seqs = {std::atoi(argv[++i])};
    } else {
      std::fprintf(stderr, "usage: stage12-variants [--json] [--dtype bf16|fp16] [--head-dim 64|128] [--seq N]\n");
      return kExitUsage;
    }
  }
  std::string why;
  if (!harness::gpu_available(&why)) {
    std::fprintf(stderr, "stage12-variants: %s\n", why.c_str());
    return kExitNoGpu;
  }
  const flash::Status arch = stage12::check_gpu();
  if (!arch.ok()) {
    std::fprintf(stderr, "stage12-variants: %s\n", flash::to_string(arch).c_str());
    return kExitNoGpu;
  }
  if (json) std::printf("[\n");
  bool first = true;
  for (flash::DType dtype : {flash::DType::kBf16, flash::DType::kFp16})
    for (int head_dim : {64, 128})
      for (bool causal : {false, true})
        for (int seq : seqs) {
          if ((only_dtype && std::strcmp(only_dtype, flash::dtype_name(dtype)) != 0) ||
              (only_head_dim != 0 && only_head_dim != head_dim))
            continue;
          harness::Problem p;
          p.batch = std::max(1, kTokens / seq);
          p.heads_q = p.heads_kv = kHeadsTimesDim / head_dim;
          p.seq_q = p.seq_kv = seq;
          p.head_dim = head_dim;
          p.causal = causal;
          p.dtype = dtype;
          const harness::DeviceInputs in(harness::make_inputs(p, kSeed), p.dtype);
          harness::DeviceTensor o(p.dtype, static_cast<size_t>(p.q_elems()));
          harness::DeviceBuffer<float> lse(p.rows());
          // -1: stage 10 as built; then every variant of stage 12, kRegistered ("as built") first.
          constexpr int kFirst = -1;
          std::vector<flash::Status> statuses(stage12::kVariantCount - kFirst);
          std::vector<std::function<void()>> launches;
          for (int v = kFirst; v < stage12::kVariantCount; ++v)
            launches.push_back([&, v] {
              flash::Status& status = statuses[v - kFirst];
              if (v < 0)
                status = registry::find(10)->forward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse.get(), p.batch,
                                                     p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim,
                                                     p.softmax_scale(), p.causal, p.dtype, nullptr, 0, nullptr);
              else
                status = stage12::forward_variant(static_cast<stage12::Variant>(v), in.q.get(), in.k.get(), in.v.get(),
                                                  o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv, p.seq_q,
                                                  p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, p.dtype, nullptr,
                                                  0, nullptr);
            });
          const std::vector<harness::Timing> timings =
              harness::time_cuda_interleaved(launches, kWarmup, kRuns, kRounds);
          for (int v = kFirst; v < stage12::kVariantCount; ++v) {
            const char* name = v < 0 ? "stage 10 as built" : stage12::variant_name(static_cast<stage12::Variant>(v));
            const flash::Status& status = statuses[v - kFirst];
            const harness::Timing& t = timings[v - kFirst];
            const double tflops = status.ok() ? harness::forward_flops(p) / (t.median_ms * 1e-3) / 1e12 : 0.0;
            if (json) {
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
  if (json) std::printf("]\n");
  return 0;
}

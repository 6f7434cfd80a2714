// stage10-variants: stage 10's kernel with other tile shapes, timed side by side on the
// FlashAttention grid (B * N = 16384 tokens, H * d = 2048, bf16), with stages 09 and 10 as built
// for reference. Lesson 10 takes its table of "what each choice buys" from this program's output;
// flash2.cu's shapes are the winners.
//
//   build/bin/stage10-variants [--json]
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_grid.h"
#include "flash2_kernel.cuh"
#include "harness.h"
#include "registry.h"

namespace {

constexpr int kExitNoGpu = 2;  // no GPU, or none with the tensor-core instructions of sm_80
constexpr int kMinComputeCapability = 80;  // what stage 10 needs: its variants are launched directly
using bench_grid::kHeadsTimesDim;
using bench_grid::kSeed;
constexpr int kWarmup = 3;
constexpr int kRuns = 10;   // timed runs per round
constexpr int kRounds = 3;  // interleaved rounds (harness::time_cuda_interleaved); the median round is reported

using Launch = flash::Status (*)(const void*, const void*, const void*, void*, float*, int, int, int, int, int, float,
                                 bool, cudaStream_t);

struct Variant {
  const char* name;  // warps x rows x keys per tile, Q in registers or shared memory, blocks per SM, lazy rescale
  int head_dim;      // 0: every head_dim (a registered stage)
  Launch launch;
};

// A registered stage as a Variant: its own choice of shape for every head_dim.
template <int kStage>
flash::Status registered(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                         int heads_kv, int seq_q, int seq_kv, float scale, bool causal, cudaStream_t stream) {
  const int head_dim = kHeadsTimesDim / heads_q;
  return registry::find(kStage)->forward(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                         causal, flash::DType::kBf16, nullptr, 0, stream);
}

template <int kHeadDim, int kWarps, int kWarpRows, int kBlockCols, bool kQInRegisters, int kMinBlocks,
          bool kLazyRescale = false>
Variant variant(const char* name) {
  using Config = stage10::TileConfig<kWarps, kWarpRows, kBlockCols, kQInRegisters, kMinBlocks, kLazyRescale>;
  return {name, kHeadDim, stage10::launch_flash2<__nv_bfloat16, kHeadDim, Config>};
}

const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
      {"stage 09 as built", 0, registered<9>},
      {"stage 10 as built", 0, registered<10>},
      variant<64, 4, 16, 64, true, 4>("4w x16r x 64k, Q regs, 4 blk/SM"),  // stage 09's shape
      variant<64, 8, 16, 64, true, 2>("8w x16r x 64k, Q regs, 2 blk/SM"),
      variant<64, 4, 32, 64, false, 2>("4w x32r x 64k, Q smem, 2 blk/SM"),
      variant<64, 4, 32, 64, true, 2>("4w x32r x 64k, Q regs, 2 blk/SM"),
      variant<64, 4, 32, 128, false, 1>("4w x32r x128k, Q smem, 1 blk/SM"),
      variant<64, 8, 32, 64, false, 1>("8w x32r x 64k, Q smem, 1 blk/SM"),
      variant<64, 4, 32, 64, true, 2, true>("4w x32r x 64k, Q regs, 2 blk/SM, lazy"),
      variant<128, 4, 16, 64, true, 1>("4w x16r x 64k, Q regs, 1 blk/SM"),  // stage 09's shape
      variant<128, 8, 16, 64, false, 2>("8w x16r x 64k, Q smem, 2 blk/SM"),
      variant<128, 4, 32, 32, false, 2>("4w x32r x 32k, Q smem, 2 blk/SM"),
      variant<128, 4, 32, 64, false, 1>("4w x32r x 64k, Q smem, 1 blk/SM"),
      variant<128, 4, 32, 64, false, 1, true>("4w x32r x 64k, Q smem, 1 blk/SM, lazy"),
      variant<128, 8, 32, 32, false, 1>("8w x32r x 32k, Q smem, 1 blk/SM"),
      variant<128, 4, 32, 32, false, 1>("4w x32r x 32k, Q smem, 1 blk/SM"),
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  std::string why;
  if (!harness::gpu_available(&why)) {
    std::fprintf(stderr, "stage10-variants: %s\n", why.c_str());
    return kExitNoGpu;
  }
  const flash::Status arch = flash::check_compute_capability(kMinComputeCapability);
  if (!arch.ok()) {
    std::fprintf(stderr, "stage10-variants: %s\n", flash::to_string(arch).c_str());
    return kExitNoGpu;
  }
  if (json) std::printf("[\n");
  bool first = true;
  for (int head_dim : bench_grid::head_dims())
    for (bool causal : {false, true})
      for (int seq : {1024, 4096, 16384}) {
        harness::Problem p;
        p.batch = bench_grid::batch_for(seq);
        p.heads_q = p.heads_kv = bench_grid::heads_for(head_dim);
        p.seq_q = p.seq_kv = seq;
        p.head_dim = head_dim;
        p.causal = causal;
        p.dtype = flash::DType::kBf16;
        const harness::DeviceInputs in(harness::make_inputs(p, kSeed), p.dtype);
        harness::DeviceTensor o(p.dtype, static_cast<size_t>(p.q_elems()));
        harness::DeviceBuffer<float> lse(p.rows());
        std::vector<const Variant*> shape_variants;
        for (const Variant& v : variants())
          if (v.head_dim == 0 || v.head_dim == head_dim) shape_variants.push_back(&v);
        std::vector<flash::Status> statuses(shape_variants.size());
        std::vector<std::function<void()>> launches;
        for (size_t i = 0; i < shape_variants.size(); ++i)
          launches.push_back([&, i] {
            statuses[i] = shape_variants[i]->launch(in.q.get(), in.k.get(), in.v.get(), o.get(), lse.get(), p.batch,
                                                    p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.softmax_scale(),
                                                    p.causal, nullptr);
          });
        const std::vector<harness::Timing> timings = harness::time_cuda_interleaved(launches, kWarmup, kRuns, kRounds);
        for (size_t i = 0; i < shape_variants.size(); ++i) {
          const Variant& v = *shape_variants[i];
          const flash::Status& status = statuses[i];
          const harness::Timing& t = timings[i];
          const double tflops = status.ok() ? harness::forward_flops(p) / (t.median_ms * 1e-3) / 1e12 : 0.0;
          if (json) {
            std::printf("%s {\"head_dim\": %d, \"causal\": %s, \"seq\": %d, \"variant\": \"%s\", \"ms\": %.5g, "
                        "\"tflops\": %.4g, \"status\": \"%s\"}\n",
                        first ? " " : ",", head_dim, causal ? "true" : "false", seq, v.name, t.median_ms, tflops,
                        flash::to_string(status).c_str());
          } else {
            std::printf("d%-4d causal=%d N=%-6d %-40s %8.3f ms %7.1f TFLOP/s %s\n", head_dim, causal ? 1 : 0, seq,
                        v.name, t.median_ms, tflops, status.ok() ? "" : flash::to_string(status).c_str());
          }
          first = false;
        }
      }
  if (json) std::printf("]\n");
  return 0;
}

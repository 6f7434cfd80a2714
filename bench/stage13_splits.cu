// stage13-splits: stage 13's split plan against the clock. For each of lesson 13's shapes (bf16,
// head_dim 128, 32 query heads on 8 K/V heads, one new query) it times stage13::forward_with_splits at
// a range of split counts and marks the count choose_splits picks. kBlockOverheadSteps in decoding.h
// is fitted to this program's output (bench/results/h100_stage13_splits.txt).
//
//   build/bin/stage13-splits
// L2 is emptied before every timed call (bench::read_through_l2), as compare.py --decode does: a
// decode call reads its cache from HBM.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "13_decoding/decoding.h"
#include "harness.h"
#include "l2_flush.h"

namespace {

constexpr int kExitNoGpu = 2;
constexpr uint64_t kSeed = 13;
constexpr int kHeadsQ = 32;
constexpr int kHeadsKv = 8;
constexpr int kHeadDim = 128;
constexpr int kWarmup = 2;
constexpr int kRuns = 30;
// The split counts tried, where a shape allows them: around one and two blocks per SM of an H100
// (132 SMs: 16 and 33 splits of 8 units), and powers of two.
constexpr int kSplitCounts[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 33, 48, 64, 96, 128};

struct Shape {
  int batch;
  int seq_kv;
};
constexpr Shape kShapes[] = {{1, 131072}, {8, 32768}, {64, 4096}, {1, 16384}, {1, 1024}};

}  // namespace

int main() {
  std::string why;
  if (!harness::gpu_available(&why)) {
    std::fprintf(stderr, "stage13-splits: %s\n", why.c_str());
    return kExitNoGpu;
  }
  int device = 0, num_sms = 0;
  harness::cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  harness::cuda_check(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  const bench::L2Flush flush;

  for (const Shape& shape : kShapes) {
    harness::Problem p;
    p.batch = shape.batch;
    p.heads_q = kHeadsQ;
    p.heads_kv = kHeadsKv;
    p.seq_q = 1;
    p.seq_kv = shape.seq_kv;
    p.head_dim = kHeadDim;
    p.dtype = flash::DType::kBf16;
    const harness::DeviceInputs in(harness::make_inputs(p, kSeed), p.dtype);
    harness::DeviceTensor o(p.dtype, static_cast<size_t>(p.q_elems()));
    const int most = stage13::max_splits(p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv);
    const int chosen = stage13::choose_splits(p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, num_sms);
    harness::DeviceBuffer<unsigned char> workspace(
        stage13::forward_workspace_size(p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim));
    const double kv_bytes = 2.0 * p.batch * p.heads_kv * static_cast<double>(p.seq_kv) * p.head_dim * 2;
    std::printf("batch %d, seq_kv %d: K+V %.0f MiB, %d SMs, max_splits %d, choose_splits %d\n", p.batch, p.seq_kv,
                kv_bytes / (1 << 20), num_sms, most, chosen);
    for (int splits : kSplitCounts) {
      if (splits > most) continue;
      const auto call = [&] {
        const flash::Status s = stage13::forward_with_splits(
            splits, in.q.get(), in.k.get(), in.v.get(), o.get(), nullptr, p.batch, p.heads_q, p.heads_kv, p.seq_q,
            p.seq_kv, p.head_dim, p.softmax_scale(), false, p.dtype, workspace.get(), workspace.bytes(), nullptr);
        if (!s.ok()) {
          std::fprintf(stderr, "stage13-splits: %s\n", flash::to_string(s).c_str());
          std::exit(1);
        }
      };
      const double median_us = harness::time_cuda(call, kWarmup, kRuns, nullptr, [&] { flush(); }).median_ms * 1e3;
      std::printf("  splits %3d  blocks %4d  %8.1f us  %6.0f GB/s%s\n", splits, p.batch * p.heads_kv * splits,
                  median_us, kv_bytes / (median_us * 1e3), splits == chosen ? "  <- choose_splits" : "");
    }
  }
  return 0;
}

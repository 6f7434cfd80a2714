// The benchmark grid every program under bench/ measures on, defined once.
//
// FlashAttention's own benchmark (benchmarks/benchmark_flash_attention.py) keeps the work per
// sequence length comparable by holding batch * seq_len at 16384 tokens and heads * head_dim at 2048
// (32 heads at head_dim 64, 16 at 128). The fp32 stages are measured with 16 heads at every head_dim,
// the shape ../shared/perf-anchors.md states PyTorch's fp32 paths for. bench/compare.py reads the
// constants below from this file, so the Python comparison and the C++ benchmarks cannot drift apart.
#pragma once

#include <cstdint>
#include <vector>

namespace bench_grid {

constexpr int kTokens = 16384;         // batch * seq_len
constexpr int kHeadsTimesDim = 2048;   // heads * head_dim, the half-precision grid
constexpr int kFp32Heads = 16;         // heads at every head_dim, the fp32 grid
constexpr uint64_t kSeed = 2024;       // the inputs' seed, the same in every program

inline const std::vector<int>& seq_lens() {
  static const std::vector<int> v = {512, 1024, 2048, 4096, 8192, 16384};
  return v;
}
inline const std::vector<int>& head_dims() {
  static const std::vector<int> v = {64, 128};
  return v;
}

// The batch that keeps batch * seq_len at kTokens (at least 1).
constexpr int batch_for(int seq_len) { return seq_len >= kTokens ? 1 : kTokens / seq_len; }
// The heads that keep heads * head_dim at kHeadsTimesDim.
constexpr int heads_for(int head_dim) { return kHeadsTimesDim / head_dim; }

}  // namespace bench_grid

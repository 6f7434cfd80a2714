// Stage 12 (Hopper) on the GPU, one kernel configuration at a time: every variant the lesson
// measures (stage12::Variant, from version A to the registered version B) on shapes that reach every
// path of the kernel: one row and one key, lengths that are not multiples of the 64-row query tiles
// or the 128- and 160-key K/V tiles, seq_q != seq_kv both ways (causal rows that see no key), a block
// whose second consumer warpgroup has no rows, GQA and MQA, several K/V tiles through the 2-buffer ring,
// both dtypes and head_dims, causal and not, a negative scale (Q negated in shared memory) and a zero
// one. Each is held to FlashAttention's half-precision rule against the fp64 reference and to the
// agreement tolerance against stage 10 on the same inputs, like the registered stage in the sweep of
// test_stages_gpu.cpp. When the registered stage fails there, these say which piece broke.
// Outputs are poisoned with NaN first. Every test name carries "stage12" (ctest -L stage12). Off a
// Hopper GPU, or in a build without stage 12's sm_90a code, every test skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "12_hopper/hopper.h"
#include "reference.h"
#include "registry.h"

namespace {

constexpr uint64_t kSeed = 12;
constexpr double kHalfLseTolerance = 1e-4;  // as in test_stages_gpu.cpp
constexpr double kReferenceMacs = 1 << 26;  // host work per case for the fp64 reference, as there

struct VariantCase {
  stage12::Variant variant;
  harness::Problem problem;
};

void PrintTo(const VariantCase& c, std::ostream* os) {
  *os << "stage 12 variant '" << stage12::variant_name(c.variant) << "', " << c.problem.describe()
      << ", scale " << c.problem.softmax_scale();
}

std::string case_name(const ::testing::TestParamInfo<VariantCase>& info) {
  const harness::Problem& p = info.param.problem;
  std::ostringstream s;
  s << "stage12_variant" << static_cast<int>(info.param.variant) << "_d" << p.head_dim << "_b" << p.batch << "h"
    << p.heads_q << "kv" << p.heads_kv << "_q" << p.seq_q << "_k" << p.seq_kv << (p.causal ? "_causal" : "") << "_"
    << flash::dtype_name(p.dtype) << (p.softmax_scale() < 0 ? "_negscale" : p.softmax_scale() == 0 ? "_zeroscale" : "")
    << "_" << info.index;
  return s.str();
}

// The forward of one variant in the registry's signature, so that registry::run_forward runs it.
template <stage12::Variant kVariant>
flash::Status variant_forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch,
                              int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                              bool causal, flash::DType dtype, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  return stage12::forward_variant(kVariant, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                                  scale, causal, dtype, workspace, workspace_bytes, stream);
}

registry::ForwardFn variant_fn(stage12::Variant v) {
  switch (v) {
    case stage12::Variant::kRegistered: return variant_forward<stage12::Variant::kRegistered>;
    case stage12::Variant::kOneConsumer: return variant_forward<stage12::Variant::kOneConsumer>;
    case stage12::Variant::kTwoConsumers: return variant_forward<stage12::Variant::kTwoConsumers>;
    case stage12::Variant::kRegisterSplit: return variant_forward<stage12::Variant::kRegisterSplit>;
    case stage12::Variant::kPingPong: return variant_forward<stage12::Variant::kPingPong>;
    case stage12::Variant::kIntraOverlap: return variant_forward<stage12::Variant::kIntraOverlap>;
    case stage12::Variant::kTmaStore: return variant_forward<stage12::Variant::kTmaStore>;
    case stage12::Variant::kPersistent: return variant_forward<stage12::Variant::kPersistent>;
    case stage12::Variant::kTilePairs: return variant_forward<stage12::Variant::kTilePairs>;
    case stage12::Variant::kBackToBack: return variant_forward<stage12::Variant::kBackToBack>;
    case stage12::Variant::kStoreBehindScores: return variant_forward<stage12::Variant::kStoreBehindScores>;
    case stage12::Variant::kLeftoverUnmasked: return variant_forward<stage12::Variant::kLeftoverUnmasked>;
    case stage12::Variant::kWideKeyTiles: return variant_forward<stage12::Variant::kWideKeyTiles>;
    case stage12::Variant::kSinglesAfterPairs: return variant_forward<stage12::Variant::kSinglesAfterPairs>;
    case stage12::Variant::kPairsAtAnyHeadCount: return variant_forward<stage12::Variant::kPairsAtAnyHeadCount>;
    case stage12::Variant::kVersionAAtHeadDim64: return variant_forward<stage12::Variant::kVersionAAtHeadDim64>;
  }
  return nullptr;
}

std::vector<VariantCase> variant_cases() {
  // {batch, heads_q, heads_kv, seq_q, seq_kv}
  const int shapes[][5] = {
      {1, 1, 1, 1, 1},        // one row, one key
      {1, 2, 2, 64, 128},     // exactly one query tile of version A, one K/V tile
      {2, 3, 3, 17, 1000},    // short query tile, 8 K/V tiles, the last one partial
      {2, 8, 2, 129, 63},     // GQA, seq_q > seq_kv: causal rows that see no key; a half-empty second consumer
      {1, 4, 1, 200, 200},    // MQA
      {1, 2, 2, 1000, 1024},  // many tiles through the ring, both consumers busy
      {2, 4, 2, 65, 2},       // two keys a row: lse's error is largest where it sums few terms
  };
  std::vector<VariantCase> cases;
  // Every shape of a list in both dtypes, at both head_dims, causal and not, for one variant.
  auto add_cases = [&cases](stage12::Variant variant, const auto& shape_list) {
    for (flash::DType dtype : {flash::DType::kBf16, flash::DType::kFp16})
      for (int head_dim : {64, 128})
        for (const auto& s : shape_list)
          for (bool causal : {false, true}) {
            harness::Problem p{s[0], s[1], s[2], s[3], s[4], head_dim, causal};
            p.dtype = dtype;
            cases.push_back({variant, p});
          }
  };
  for (int v = 1; v < stage12::kVariantCount; ++v) add_cases(static_cast<stage12::Variant>(v), shapes);
  // Persistent blocks: more work tiles than an H100 has SMs, so that blocks take several in turn
  // (the ring and Q carried over, odd and even tile counts), and causal work tiles that see no key
  // (seq_q > seq_kv) between tiles that do. In pairs (kTilePairs), 3 query tiles a head leave the
  // middle one without a partner. Back to back (kBackToBack), the turns and O's store carry over
  // those tiles too; with kStoreBehindScores, O's store moves into the next work tile, past the tiles
  // that see no key; with kLeftoverUnmasked, 4 K/V tiles leave one after the pairs, unmasked. With
  // kSinglesAfterPairs (causal; on an H100's 132 SMs), 66 of the 160 heads of the first and third
  // shape run their tiles one at a time after the pairs of the others, 132 of the 144 of the second
  // and fourth.
  const int many_tiles[][5] = {
      {4, 40, 8, 300, 257},  // 480 work tiles of 3 K/V tiles or fewer (causal)
      {3, 48, 48, 129, 63},  // 288 work tiles; causal: the first 66 rows of each head see no key
      {4, 40, 8, 400, 100},  // causal: query tiles 0 and 1 of each head see no key, each second in its pair
      {3, 48, 16, 256, 512},  // 288 work tiles of 4 K/V tiles, none masked when not causal
  };
  for (stage12::Variant variant :
       {stage12::Variant::kPersistent, stage12::Variant::kTilePairs, stage12::Variant::kBackToBack,
        stage12::Variant::kStoreBehindScores, stage12::Variant::kLeftoverUnmasked, stage12::Variant::kWideKeyTiles,
        stage12::Variant::kSinglesAfterPairs, stage12::Variant::kPairsAtAnyHeadCount,
        stage12::Variant::kVersionAAtHeadDim64})
    add_cases(variant, many_tiles);
  // Pairs and the single tiles after them with an odd count of query tiles (causal): 140 heads of 5 query
  // tiles, 3 units a head, 44 heads in the tail; with kPairsAtAnyHeadCount, also 8 heads of 64 query tiles,
  // 32 pairs a head, 5 heads in the tail.
  const int tails[][5] = {
      {2, 70, 10, 640, 640},
      {1, 8, 2, 8192, 8192},
  };
  add_cases(stage12::Variant::kSinglesAfterPairs, tails);
  add_cases(stage12::Variant::kPairsAtAnyHeadCount, tails);
  add_cases(stage12::Variant::kVersionAAtHeadDim64, tails);
  // 160 keys a K/V tile (kWideKeyTiles) at head_dim 64, where seq_kv >= 2048 (causal: 4096); the
  // shorter shapes above take the 128-key kernel. At head_dim 128, the same shapes on 128 keys.
  const int long_keys[][5] = {
      {1, 2, 1, 257, 4133},    // GQA; 26 K/V tiles, the last partial (4133 = 25 * 160 + 133); causal, rows
                               // whose diagonal falls in one tile or across two
      {1, 1, 1, 300, 2240},    // 14 tiles of 160 keys: the last, after the pairs, unmasked when not causal
      {1, 140, 20, 16, 4100},  // 140 work tiles, more than an H100 has SMs, each of 26 K/V tiles
  };
  add_cases(stage12::Variant::kWideKeyTiles, long_keys);
  add_cases(stage12::Variant::kVersionAAtHeadDim64, long_keys);  // not causal at head_dim 64: version A's kernel
  // A negative scale (Q negated in shared memory, with its proxy fence) for every variant; a zero
  // scale, where every visible key weighs the same, masked tiles included.
  for (int v = 1; v < stage12::kVariantCount; ++v) {
    harness::Problem p{2, 4, 2, 129, 200, 128, true};
    p.dtype = flash::DType::kBf16;
    p.scale = -0.2f;
    cases.push_back({static_cast<stage12::Variant>(v), p});
    p.head_dim = 64;
    p.scale = 0.0f;
    cases.push_back({static_cast<stage12::Variant>(v), p});
  }
  return cases;
}

class Stage12Variant : public ::testing::TestWithParam<VariantCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!harness::gpu_available(&why)) GTEST_SKIP() << why;
    const flash::Status status = stage12::check_gpu();
    if (status.code == flash::StatusCode::kArchNotSupported) GTEST_SKIP() << "stage12: " << flash::to_string(status);
  }
};

TEST_P(Stage12Variant, MatchesReferenceAndStage10) {
  const harness::Problem& p = GetParam().problem;
  registry::Stage variant = *registry::find(12);
  variant.forward = variant_fn(GetParam().variant);
  const harness::HostInputs host = harness::make_inputs(p, kSeed);
  const registry::ForwardResult got = registry::run_forward(variant, p, host);
  ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
  EXPECT_EQ(harness::count_nonfinite(got.o), 0u) << "unwritten or non-finite output";

  const long long max_rows = std::max(64LL, static_cast<long long>(kReferenceMacs / (2.0 * p.seq_kv * p.head_dim)));
  const std::vector<long long> rows = harness::sample_rows(p.rows(), max_rows);
  const reference::HalfPrecisionCheck check =
      reference::check_half_precision(p, host, rows, harness::gather_rows(got.o, rows, p.head_dim));
  EXPECT_TRUE(check.passes()) << "O vs reference: " << check.error.describe() << ", allowed max_abs " << check.bound;
  const harness::ErrorStats lse_err = harness::compare(harness::gather_rows(got.lse, rows, 1), check.exact.lse);
  EXPECT_TRUE(lse_err.within(kHalfLseTolerance)) << "lse vs reference: " << lse_err.describe();

  const registry::ForwardResult before = registry::run_forward(*registry::find(10), p, host);
  ASSERT_TRUE(before.status.ok()) << flash::to_string(before.status);
  const harness::ErrorStats prev_err = harness::compare(got.o, before.o);
  const double tolerance = harness::agreement_tolerance(p.dtype, p.dtype);
  EXPECT_TRUE(prev_err.within(tolerance)) << "O vs stage 10: " << prev_err.describe() << " (allowed " << tolerance
                                          << ")";
}

INSTANTIATE_TEST_SUITE_P(Variants, Stage12Variant, ::testing::ValuesIn(variant_cases()), case_name);

// The variants are the same function: on the same inputs each agrees with version A to rounding
// (their sums run in other orders only where the overlapped loop regroups them; the products are
// the same wgmma).
TEST(stage12_hopper, VariantsAgreeWithVersionA) {
  std::string why;
  if (!harness::gpu_available(&why)) GTEST_SKIP() << why;
  const flash::Status gpu = stage12::check_gpu();
  if (gpu.code == flash::StatusCode::kArchNotSupported) GTEST_SKIP() << "stage12: " << flash::to_string(gpu);
  harness::Problem p{2, 8, 2, 1000, 1024, 128, true};
  p.dtype = flash::DType::kBf16;
  const harness::HostInputs host = harness::make_inputs(p, kSeed);
  registry::Stage a = *registry::find(12);
  a.forward = variant_fn(stage12::Variant::kOneConsumer);
  const registry::ForwardResult base = registry::run_forward(a, p, host);
  ASSERT_TRUE(base.status.ok()) << flash::to_string(base.status);
  for (int v = 2; v < stage12::kVariantCount; ++v) {
    registry::Stage s = *registry::find(12);
    s.forward = variant_fn(static_cast<stage12::Variant>(v));
    const registry::ForwardResult got = registry::run_forward(s, p, host);
    ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
    const harness::ErrorStats err = harness::compare(got.o, base.o);
    EXPECT_TRUE(err.within(harness::agreement_tolerance(p.dtype, p.dtype)))
        << stage12::variant_name(static_cast<stage12::Variant>(v)) << " vs version A: " << err.describe();
  }
}

}  // namespace

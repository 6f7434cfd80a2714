// Stage 12 (Hopper) on the GPU, on shapes that reach every path of its two kernels: one row and one
// key, lengths that are not multiples of the 64-row query tiles or the 128- and 160-key K/V tiles,
// seq_q != seq_kv both ways (causal rows that see no key), a block whose second consumer warpgroup has
// no rows, GQA and MQA, several K/V tiles through the 2-buffer ring, more work tiles than SMs
// (persistent blocks taking several in turn), causal pairs with an odd count of query tiles and the
// tail of single tiles, the 160-key tiles at head_dim 64, both dtypes and head_dims, causal and not, a
// negative scale (Q negated in shared memory) and a zero one. Each is held to FlashAttention's
// half-precision rule against the fp64 reference and to the agreement tolerance against stage 10 on
// the same inputs, like the sweep of test_stages_gpu.cpp. Outputs are poisoned with NaN first. Every
// test name carries "stage12" (ctest -L stage12). Off a Hopper GPU, or in a build without stage 12's
// sm_90a code, every test skips with the reason. The ladder of configurations the lesson measures is
// checked by bench/stage12_variants.cu --check (ctest -L full).
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

std::string case_name(const ::testing::TestParamInfo<harness::Problem>& info) {
  const harness::Problem& p = info.param;
  std::ostringstream s;
  s << "stage12_d" << p.head_dim << "_b" << p.batch << "h" << p.heads_q << "kv" << p.heads_kv << "_q" << p.seq_q
    << "_k" << p.seq_kv << (p.causal ? "_causal" : "") << "_" << flash::dtype_name(p.dtype)
    << (p.softmax_scale() < 0 ? "_negscale" : p.softmax_scale() == 0 ? "_zeroscale" : "") << "_" << info.index;
  return s.str();
}

std::vector<harness::Problem> hopper_cases() {
  // {batch, heads_q, heads_kv, seq_q, seq_kv}
  const int shapes[][5] = {
      {1, 1, 1, 1, 1},        // one row, one key
      {1, 2, 2, 64, 128},     // exactly one query tile of the in-order kernel, one K/V tile
      {2, 3, 3, 17, 1000},    // short query tile, 8 K/V tiles, the last one partial
      {2, 8, 2, 129, 63},     // GQA, seq_q > seq_kv: causal rows that see no key; a half-empty second consumer
      {1, 4, 1, 200, 200},    // MQA
      {1, 2, 2, 1000, 1024},  // many tiles through the ring, both consumers busy
      {2, 4, 2, 65, 2},       // two keys a row: lse's error is largest where it sums few terms
      // Persistent blocks: more work tiles than an H100 has SMs, so that blocks take several in turn
      // (the ring, Q and the ping-pong turns carried over, O's store behind the next work tile's
      // scores, odd and even tile counts), and causal work tiles that see no key between tiles that do.
      // Causal, in pairs: 3 query tiles a head leave the middle one without a partner; on an H100's 132
      // SMs the tail holds 66 of the 160 heads of the first and third shape, 132 of the 144 of the
      // second and fourth.
      {4, 40, 8, 300, 257},   // 480 work tiles of 3 K/V tiles or fewer (causal)
      {3, 48, 48, 129, 63},   // 288 work tiles; causal: the first 66 rows of each head see no key
      {4, 40, 8, 400, 100},   // causal: query tiles 0 and 1 of each head see no key, each second in its pair
      {3, 48, 16, 256, 512},  // 4 K/V tiles: one left after the pairs, unmasked when not causal
      // Causal pairs with an odd count of query tiles: 140 heads of 5 query tiles, 3 units a head, 44
      // heads in the tail; 8 heads of 64 query tiles, 32 pairs a head, 5 heads in the tail (and, at
      // head_dim 64, 160-key tiles).
      {2, 70, 10, 640, 640},
      {1, 8, 2, 8192, 8192},
      // 160 keys a K/V tile at head_dim 64 causal, where seq_kv >= 4096; the in-order kernel at head_dim
      // 64 without the mask; 128-key tiles at head_dim 128.
      {1, 2, 1, 257, 4133},    // GQA; 26 K/V tiles, the last partial (4133 = 25 * 160 + 133); causal, rows
                               // whose diagonal falls in one tile or across two
      {1, 1, 1, 300, 2240},    // 18 K/V tiles of 128 keys, the last partial (2240 = 17 * 128 + 64)
      {1, 140, 20, 16, 4100},  // 140 work tiles, more than an H100 has SMs, each of 26 K/V tiles
  };
  std::vector<harness::Problem> cases;
  for (flash::DType dtype : {flash::DType::kBf16, flash::DType::kFp16})
    for (int head_dim : {64, 128})
      for (const auto& s : shapes)
        for (bool causal : {false, true}) {
          harness::Problem p{s[0], s[1], s[2], s[3], s[4], head_dim, causal};
          p.dtype = dtype;
          cases.push_back(p);
        }
  // A negative scale (Q negated in shared memory, with its proxy fence) in both kernels; a zero scale,
  // where every visible key weighs the same, masked tiles included.
  for (bool causal : {false, true}) {
    harness::Problem p{2, 4, 2, 129, 200, 128, causal};
    p.dtype = flash::DType::kBf16;
    p.scale = -0.2f;
    cases.push_back(p);
    p.head_dim = 64;
    cases.push_back(p);
    p.scale = 0.0f;
    cases.push_back(p);
  }
  return cases;
}

class Stage12Hopper : public ::testing::TestWithParam<harness::Problem> {
 protected:
  void SetUp() override {
    std::string why;
    if (!harness::gpu_available(&why)) GTEST_SKIP() << why;
    const flash::Status status = stage12::check_gpu();
    if (status.code == flash::StatusCode::kArchNotSupported) GTEST_SKIP() << "stage12: " << flash::to_string(status);
  }
};

TEST_P(Stage12Hopper, MatchesReferenceAndStage10) {
  const harness::Problem& p = GetParam();
  const harness::HostInputs host = harness::make_inputs(p, kSeed);
  const registry::ForwardResult got = registry::run_forward(*registry::find(12), p, host);
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

INSTANTIATE_TEST_SUITE_P(Paths, Stage12Hopper, ::testing::ValuesIn(hopper_cases()), case_name);

}  // namespace

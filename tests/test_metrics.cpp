// The metrics must not let a broken result through: NaN counts as an error, sizes must agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "flash_stage.cuh"
#include "harness.h"

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Metrics, ExactMatchHasZeroError) {
  const harness::ErrorStats e = harness::compare(std::vector<float>{1, -2, 3}, std::vector<double>{1, -2, 3});
  EXPECT_EQ(e.max_abs, 0.0);
  EXPECT_EQ(e.rel_l2, 0.0);
  EXPECT_EQ(e.nonfinite, 0u);
  EXPECT_TRUE(e.within(1e-12));
}

TEST(Metrics, RelativeL2AndMaxAbsAreComputed) {
  // diff = (0, 0.5, 0, 0): ||diff|| = 0.5, ||ref|| = sqrt(1 + 4 + 4 + 16) = 5.
  const harness::ErrorStats e = harness::compare(std::vector<float>{1, 2.5f, 2, 4}, std::vector<double>{1, 2, 2, 4});
  EXPECT_DOUBLE_EQ(e.max_abs, 0.5);
  EXPECT_DOUBLE_EQ(e.rel_l2, 0.1);
  EXPECT_FALSE(e.within(0.05));
}

TEST(Metrics, NaNNeverPasses) {
  const harness::ErrorStats e = harness::compare(std::vector<float>{1, kNaN}, std::vector<double>{1, 2});
  EXPECT_EQ(e.nonfinite, 1u);
  EXPECT_FALSE(e.within(1e30));
}

TEST(Metrics, InfinityWhereReferenceIsFiniteFails) {
  EXPECT_EQ(harness::compare(std::vector<float>{kInf}, std::vector<double>{1}).nonfinite, 1u);
}

TEST(Metrics, MatchingMinusInfinityAgrees) {  // the lse of a row that sees no key
  const harness::ErrorStats e = harness::compare(std::vector<float>{-kInf, 1}, std::vector<float>{-kInf, 1});
  EXPECT_EQ(e.nonfinite, 0u);
  EXPECT_TRUE(e.within(0.0));
}

TEST(Metrics, SizeMismatchThrows) {
  EXPECT_THROW(harness::compare(std::vector<float>{1, 2}, std::vector<double>{1}), std::invalid_argument);
  EXPECT_THROW(harness::compare(std::vector<float>{1}, std::vector<float>{}), std::invalid_argument);
}

TEST(Metrics, CountNonfinite) {
  EXPECT_EQ(harness::count_nonfinite({1, kNaN, kInf, -kInf, 0}), 3u);
}

TEST(Metrics, SampleRowsKeepsEndsAndLimit) {
  EXPECT_EQ(harness::sample_rows(5, 10), (std::vector<long long>{0, 1, 2, 3, 4}));
  const std::vector<long long> rows = harness::sample_rows(1000, 4);
  EXPECT_EQ(rows, (std::vector<long long>{0, 333, 666, 999}));
}

TEST(Metrics, FlopsFollowTheFlashAttentionConvention) {
  harness::Problem p;
  p.batch = 2;
  p.heads_q = 3;
  p.seq_q = p.seq_kv = 10;
  p.head_dim = 64;
  EXPECT_DOUBLE_EQ(harness::forward_flops(p), 4.0 * 2 * 3 * 10 * 10 * 64);
  // Causal counts the pairs the mask lets through: 1 + 2 + ... + 10 = 55 of 100 (the convention's
  // "halved" is the large-N limit of (N^2 + N) / 2).
  p.causal = true;
  EXPECT_DOUBLE_EQ(harness::forward_flops(p), 4.0 * 2 * 3 * 55 * 64);
}

// Bottom-right causal with seq_q != seq_kv, counted pair by pair against the closed form.
TEST(Metrics, CausalFlopsCountVisiblePairsExactly) {
  for (const auto& [seq_q, seq_kv] : {std::pair{1, 100}, {100, 1}, {7, 30}, {30, 7}, {64, 64}, {5, 2}, {2, 5}}) {
    harness::Problem p;
    p.seq_q = seq_q;
    p.seq_kv = seq_kv;
    p.causal = true;
    double pairs = 0;
    for (int i = 0; i < seq_q; ++i) pairs += std::clamp(flash::causal_key_end(i, seq_q, seq_kv), 0, seq_kv);
    EXPECT_DOUBLE_EQ(p.visible_pairs(), pairs) << "seq_q=" << seq_q << " seq_kv=" << seq_kv;
    EXPECT_DOUBLE_EQ(harness::forward_flops(p), 4.0 * pairs * p.head_dim);
  }
  harness::Problem one_query;  // a single new token sees the whole cache
  one_query.seq_q = 1;
  one_query.seq_kv = 4096;
  one_query.causal = true;
  EXPECT_DOUBLE_EQ(one_query.visible_pairs(), 4096.0);
}

// Half inputs are exactly representable in their dtype, so an fp32 stage sees what a half stage reads.
TEST(Metrics, HalfInputsAreRoundedToTheirDtype) {
  for (flash::DType dtype : {flash::DType::kFp16, flash::DType::kBf16}) {
    harness::Problem p;
    p.seq_q = p.seq_kv = 16;
    p.dtype = dtype;
    const harness::HostInputs in = harness::make_inputs(p, 3);
    for (float x : in.q) EXPECT_EQ(harness::round_to(dtype, x), x);
    EXPECT_EQ(harness::decode(harness::encode(in.k, dtype), dtype), in.k);
  }
  EXPECT_EQ(harness::round_to(flash::DType::kBf16, 1.0f + 1.0f / 512), 1.0f);  // under half of bf16's 2^-7 ulp at 1
  EXPECT_EQ(harness::round_to(flash::DType::kFp16, 1.0f + 1.0f / 4096), 1.0f);
  EXPECT_EQ(harness::round_to(flash::DType::kFp16, 1.0f + 1.0f / 1024), 1.0f + 1.0f / 1024);
}

TEST(Metrics, InputsAreSeededAndNotZero) {
  harness::Problem p;
  p.seq_q = p.seq_kv = 8;
  const harness::HostInputs a = harness::make_inputs(p, 7), b = harness::make_inputs(p, 7), c = harness::make_inputs(p, 8);
  EXPECT_EQ(a.q, b.q);
  EXPECT_NE(a.q, c.q);
  EXPECT_EQ(a.q.size(), static_cast<size_t>(p.q_elems()));
  EXPECT_EQ(a.k.size(), static_cast<size_t>(p.kv_elems()));
  double norm = 0;
  for (float x : a.v) norm += x * x;
  EXPECT_GT(norm, 0.0);
}

// A CUDA failure reaches the user with CUDA's own words.
TEST(StatusMessages, CudaErrorCarriesCudasMessage) {
  const std::string m = flash::to_string(flash::cuda_status(cudaErrorMemoryAllocation));
  EXPECT_NE(m.find(cudaGetErrorString(cudaErrorMemoryAllocation)), std::string::npos) << m;
}

}  // namespace

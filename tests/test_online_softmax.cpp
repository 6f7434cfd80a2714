// flash::merge_softmax_stats is the online-softmax update every fused stage runs on the device.
// Here it runs on the host: whatever way the keys are split into parts, and in whatever order the
// parts are merged, the result must be the softmax of the whole row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "flash_stage.cuh"

namespace {

constexpr int kCases = 200;
constexpr int kValueWidth = 3;

// A partial result over some keys: its statistics and its accumulator sum exp(s - row_max) * v.
struct Partial {
  flash::SoftmaxStats stats;
  float acc[kValueWidth];
};

Partial merge(const Partial& a, const Partial& b) {
  Partial out;
  float rescale_a, rescale_b;
  out.stats = flash::merge_softmax_stats(a.stats, b.stats, &rescale_a, &rescale_b);
  for (int c = 0; c < kValueWidth; ++c) out.acc[c] = a.acc[c] * rescale_a + b.acc[c] * rescale_b;
  return out;
}

Partial single_key(float score, const float* value) {
  Partial p{{score, 1.0f}, {}};
  for (int c = 0; c < kValueWidth; ++c) p.acc[c] = value[c];
  return p;
}

TEST(OnlineSoftmax, AnySplitAndMergeOrderGivesTheSoftmax) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < kCases; ++trial) {
    const int n = std::uniform_int_distribution<int>(1, 300)(rng);
    // Some cases have scores in the hundreds: exp of them overflows unless the max is tracked.
    const float spread = trial % 4 == 0 ? 200.0f : 3.0f;
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<float> scores(n), values(n * kValueWidth);
    for (float& s : scores) s = normal(rng);
    for (float& v : values) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);

    // The softmax in double, directly.
    const double m = *std::max_element(scores.begin(), scores.end());
    double sum = 0, out[kValueWidth] = {};
    for (int j = 0; j < n; ++j) {
      const double w = std::exp(scores[j] - m);
      sum += w;
      for (int c = 0; c < kValueWidth; ++c) out[c] += w * values[j * kValueWidth + c];
    }
    const double lse = m + std::log(sum);

    // Split into random contiguous parts, fold each left to right, then merge the parts in a
    // random order (always two neighbours, so the keys stay in order within a merge).
    std::vector<Partial> parts;
    for (int j = 0; j < n;) {
      const int len = std::uniform_int_distribution<int>(1, std::max(1, n / 3))(rng);
      Partial part = single_key(scores[j], &values[j * kValueWidth]);
      for (int e = j + 1; e < std::min(n, j + len); ++e) part = merge(part, single_key(scores[e], &values[e * kValueWidth]));
      parts.push_back(part);
      j += len;
    }
    while (parts.size() > 1) {
      const size_t at = std::uniform_int_distribution<size_t>(0, parts.size() - 2)(rng);
      parts[at] = merge(parts[at], parts[at + 1]);
      parts.erase(parts.begin() + at + 1);
    }

    const Partial& total = parts[0];
    ASSERT_NEAR(flash::softmax_lse(total.stats), lse, 1e-5 * (1 + std::abs(lse))) << "trial " << trial;
    for (int c = 0; c < kValueWidth; ++c)
      ASSERT_NEAR(total.acc[c] * flash::softmax_normalizer(total.stats), out[c] / sum, 1e-5)
          << "trial " << trial << " n=" << n;
  }
}

TEST(OnlineSoftmax, MergeIsOrderIndependentForTwoParts) {
  const float v1[kValueWidth] = {1, 2, 3}, v2[kValueWidth] = {-1, 0, 5};
  const Partial a = single_key(2.0f, v1), b = single_key(-7.0f, v2);
  const Partial ab = merge(a, b), ba = merge(b, a);
  EXPECT_FLOAT_EQ(ab.stats.row_max, ba.stats.row_max);
  EXPECT_FLOAT_EQ(ab.stats.row_sum, ba.stats.row_sum);
  for (int c = 0; c < kValueWidth; ++c) EXPECT_FLOAT_EQ(ab.acc[c], ba.acc[c]);
}

TEST(OnlineSoftmax, EmptyStatsAreTheIdentity) {
  const float v[kValueWidth] = {4, 5, 6};
  const Partial empty{flash::empty_softmax_stats(), {}};
  const Partial one = single_key(3.5f, v);
  const Partial merged = merge(empty, one);
  EXPECT_EQ(merged.stats.row_max, 3.5f);
  EXPECT_EQ(merged.stats.row_sum, 1.0f);
  for (int c = 0; c < kValueWidth; ++c) EXPECT_EQ(merged.acc[c], v[c]);
}

// Two fully masked parts must stay empty, not turn into NaN through exp(-inf - -inf).
TEST(OnlineSoftmax, MergingEmptyWithEmptyStaysEmptyAndFinite) {
  const Partial empty{flash::empty_softmax_stats(), {}};
  const Partial merged = merge(empty, empty);
  EXPECT_EQ(merged.stats.row_sum, 0.0f);
  EXPECT_EQ(flash::softmax_lse(merged.stats), -INFINITY);
  EXPECT_EQ(flash::softmax_normalizer(merged.stats), 0.0f);
  for (int c = 0; c < kValueWidth; ++c) EXPECT_EQ(merged.acc[c], 0.0f);
}

}  // namespace

// The fp64 reference is the truth for every stage, so it is tested on its own: against cases worked
// by hand, against properties attention must have, and (backward) against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "reference.h"

namespace {

harness::Problem small_problem(int seq_q, int seq_kv, int head_dim, bool causal = false) {
  harness::Problem p;
  p.seq_q = seq_q;
  p.seq_kv = seq_kv;
  p.head_dim = head_dim;
  p.causal = causal;
  return p;
}

// One query, two keys, head_dim 1, scale 1: scores (0, ln 3), so P = (1/4, 3/4); with V = (4, 8)
// the output is 1 + 6 = 7 and lse = log(e^0 + e^ln3) = log 4.
TEST(Reference, TwoKeysByHand) {
  harness::Problem p = small_problem(1, 2, 1);
  p.scale = 1.0f;
  harness::HostInputs in;
  in.q = {1.0f};
  in.k = {0.0f, static_cast<float>(std::log(3.0))};
  in.v = {4.0f, 8.0f};
  const reference::ForwardRows r = reference::forward(p, in);
  EXPECT_NEAR(r.o[0], 7.0, 1e-6);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-7);
}

// Causal, bottom-right aligned. seq_q = 2, seq_kv = 3: query 0 sees keys 0..1, query 1 sees 0..2.
// With identical scores the output is the mean of the visible values.
TEST(Reference, CausalBottomRightByHand) {
  harness::Problem p = small_problem(2, 3, 1, true);
  harness::HostInputs in;
  in.q = {0.0f, 0.0f};
  in.k = {1.0f, 2.0f, 3.0f};
  in.v = {3.0f, 6.0f, 12.0f};
  const reference::ForwardRows r = reference::forward(p, in);
  EXPECT_NEAR(r.o[0], 4.5, 1e-12);
  EXPECT_NEAR(r.o[1], 7.0, 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(2.0), 1e-12);
  EXPECT_NEAR(r.lse[1], std::log(3.0), 1e-12);
}

// seq_q = 3 > seq_kv = 2: query 0 would need key -1, so it sees nothing: O = 0 and lse = -inf.
TEST(Reference, CausalRowThatSeesNoKey) {
  harness::Problem p = small_problem(3, 2, 1, true);
  harness::HostInputs in;
  in.q = {1.0f, 1.0f, 1.0f};
  in.k = {1.0f, 1.0f};
  in.v = {5.0f, 7.0f};
  const reference::ForwardRows r = reference::forward(p, in);
  EXPECT_EQ(r.o[0], 0.0);
  EXPECT_EQ(r.lse[0], -std::numeric_limits<double>::infinity());
  EXPECT_NEAR(r.o[1], 5.0, 1e-12);  // sees key 0 only
  EXPECT_NEAR(r.o[2], 6.0, 1e-12);  // equal scores: the mean
}

// Adding the same vector u to every key adds scale * q.u to every score of a row: softmax is
// shift-invariant, so O is unchanged and lse moves by exactly that shift.
TEST(Reference, SoftmaxShiftInvariance) {
  const harness::Problem p = small_problem(5, 9, 8);
  harness::HostInputs in = harness::make_inputs(p, 11);
  const reference::ForwardRows before = reference::forward(p, in);
  std::vector<float> u(p.head_dim);
  for (int c = 0; c < p.head_dim; ++c) u[c] = 0.25f * (c % 3);
  for (size_t e = 0; e < in.k.size(); ++e) in.k[e] += u[e % p.head_dim];
  const reference::ForwardRows after = reference::forward(p, in);
  for (int i = 0; i < p.seq_q; ++i) {
    double shift = 0;
    for (int c = 0; c < p.head_dim; ++c) shift += static_cast<double>(in.q[i * p.head_dim + c]) * u[c];
    EXPECT_NEAR(after.lse[i] - before.lse[i], p.softmax_scale() * shift, 1e-5);
    for (int c = 0; c < p.head_dim; ++c) EXPECT_NEAR(after.o[i * p.head_dim + c], before.o[i * p.head_dim + c], 1e-5);
  }
}

// lse alone recovers the probabilities, P_j = exp(s_j - lse): the identity the backward relies on.
TEST(Reference, LseReproducesOutput) {
  const harness::Problem p = small_problem(4, 7, 4);
  const harness::HostInputs in = harness::make_inputs(p, 12);
  const reference::ForwardRows r = reference::forward(p, in);
  for (int i = 0; i < p.seq_q; ++i) {
    std::vector<double> o(p.head_dim, 0.0);
    for (int j = 0; j < p.seq_kv; ++j) {
      double s = 0;
      for (int c = 0; c < p.head_dim; ++c) s += static_cast<double>(in.q[i * p.head_dim + c]) * in.k[j * p.head_dim + c];
      const double prob = std::exp(p.softmax_scale() * s - r.lse[i]);
      for (int c = 0; c < p.head_dim; ++c) o[c] += prob * in.v[j * p.head_dim + c];
    }
    for (int c = 0; c < p.head_dim; ++c) EXPECT_NEAR(o[c], r.o[i * p.head_dim + c], 1e-6);
  }
}

// GQA is MHA with each K/V head repeated for its group of query heads.
TEST(Reference, GroupedQueryEqualsRepeatedHeads) {
  harness::Problem gqa = small_problem(6, 5, 4, true);
  gqa.batch = 2;
  gqa.heads_q = 4;
  gqa.heads_kv = 2;
  const harness::HostInputs in = harness::make_inputs(gqa, 13);
  harness::Problem mha = gqa;
  mha.heads_kv = 4;
  harness::HostInputs repeated = in;
  repeated.k.clear();
  repeated.v.clear();
  const long long head_elems = static_cast<long long>(gqa.seq_kv) * gqa.head_dim;
  for (int b = 0; b < gqa.batch; ++b)
    for (int h = 0; h < gqa.heads_q; ++h) {
      const long long src = (static_cast<long long>(b) * gqa.heads_kv + h / 2) * head_elems;
      repeated.k.insert(repeated.k.end(), in.k.begin() + src, in.k.begin() + src + head_elems);
      repeated.v.insert(repeated.v.end(), in.v.begin() + src, in.v.begin() + src + head_elems);
    }
  const reference::ForwardRows a = reference::forward(gqa, in), b = reference::forward(mha, repeated);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
}

TEST(Reference, PickedRowsMatchFullForward) {
  const harness::Problem p = small_problem(9, 4, 4);
  const harness::HostInputs in = harness::make_inputs(p, 14);
  const reference::ForwardRows all = reference::forward(p, in);
  const std::vector<long long> rows = {0, 4, 8};
  const reference::ForwardRows some = reference::forward_rows(p, in, rows);
  for (size_t n = 0; n < rows.size(); ++n) {
    EXPECT_EQ(some.lse[n], all.lse[rows[n]]);
    for (int c = 0; c < p.head_dim; ++c) EXPECT_EQ(some.o[n * p.head_dim + c], all.o[rows[n] * p.head_dim + c]);
  }
}

// The backward against central differences of f = sum(O * dO). Steps are taken in fp32 (the
// inputs' type) and divided by the step actually taken, so the only error is the O(h^2) term.
class ReferenceBackward : public ::testing::TestWithParam<bool> {};

TEST_P(ReferenceBackward, MatchesFiniteDifferences) {
  harness::Problem p = small_problem(3, 4, 4, GetParam());
  p.batch = 2;
  p.heads_q = 2;
  p.heads_kv = 1;  // GQA: dK and dV sum over both query heads
  const harness::HostInputs in = harness::make_inputs(p, 21);
  const reference::Gradients g = reference::backward(p, in);

  auto loss = [&](const harness::HostInputs& x) {
    const reference::ForwardRows r = reference::forward(p, x);
    double f = 0;
    for (size_t e = 0; e < r.o.size(); ++e) f += r.o[e] * x.d_out[e];
    return f;
  };
  constexpr float kStep = 1e-3f;
  auto check = [&](std::vector<float> harness::HostInputs::*tensor, const std::vector<double>& grad, const char* name) {
    for (size_t e = 0; e < grad.size(); ++e) {
      harness::HostInputs plus = in, minus = in;
      (plus.*tensor)[e] += kStep;
      (minus.*tensor)[e] -= kStep;
      const double step = static_cast<double>((plus.*tensor)[e]) - (minus.*tensor)[e];
      const double fd = (loss(plus) - loss(minus)) / step;
      EXPECT_NEAR(grad[e], fd, 1e-5 * (1.0 + std::abs(fd))) << name << "[" << e << "]";
    }
  };
  check(&harness::HostInputs::q, g.dq, "dq");
  check(&harness::HostInputs::k, g.dk, "dk");
  check(&harness::HostInputs::v, g.dv, "dv");
}

INSTANTIATE_TEST_SUITE_P(CausalOffOn, ReferenceBackward, ::testing::Bool());

// The half-precision baseline of the backward (backward_in_dtype): in bf16 it differs from the exact
// gradients by the rounding of its stored tensors, more than fp32 rounding and far less than a wrong
// formula; and it keeps every exact zero (one visible key: P = 1 exactly, dS = dP - D = 0).
TEST(ReferenceBackwardInDtype, Bf16BaselineIsCloseButNotExact) {
  harness::Problem p = small_problem(40, 50, 32, true);
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.dtype = flash::DType::kBf16;
  const harness::HostInputs in = harness::make_inputs(p, 22);
  const reference::Gradients exact = reference::backward(p, in);
  const reference::Gradients rounded = reference::backward_in_dtype(p, in);
  for (const auto& [name, x, r] : {std::tuple{"dq", &rounded.dq, &exact.dq}, {"dk", &rounded.dk, &exact.dk},
                                   {"dv", &rounded.dv, &exact.dv}}) {
    const harness::ErrorStats err = harness::compare(std::vector<float>(x->begin(), x->end()), *r);
    EXPECT_GT(err.rel_l2, 1e-4) << name << ": bf16 rounding should show, " << err.describe();
    EXPECT_LT(err.rel_l2, 3e-2) << name << ": more than rounding, " << err.describe();
  }
  // Each gradient rounded to bf16 at the end: every element is a bf16 value.
  for (double x : rounded.dk) EXPECT_EQ(static_cast<float>(x), harness::round_to(p.dtype, static_cast<float>(x)));

  harness::Problem one_key = small_problem(3, 1, 32);
  one_key.dtype = flash::DType::kBf16;
  const harness::HostInputs in1 = harness::make_inputs(one_key, 23);
  const reference::Gradients zero = reference::backward_in_dtype(one_key, in1);
  for (double x : zero.dq) EXPECT_EQ(x, 0.0);
  for (double x : zero.dk) EXPECT_EQ(x, 0.0);
}

// In fp32 the "rounded" baseline differs from the exact gradients only by fp32 rounding.
TEST(ReferenceBackwardInDtype, Fp32BaselineIsTheExactOneToFp32) {
  harness::Problem p = small_problem(17, 33, 64, false);
  const harness::HostInputs in = harness::make_inputs(p, 24);
  const reference::Gradients exact = reference::backward(p, in);
  const reference::Gradients rounded = reference::backward_in_dtype(p, in);
  const harness::ErrorStats err = harness::compare(std::vector<float>(rounded.dq.begin(), rounded.dq.end()), exact.dq);
  EXPECT_LT(err.rel_l2, 1e-6) << err.describe();
}

// The rule's arithmetic: bound = 2 * baseline + stored-O term + slack, and a non-finite element
// fails whatever its size.
TEST(ReferenceBackwardInDtype, RuleBoundAndNonFinite) {
  const std::vector<double> exact = {1.0, -2.0, 0.5};
  const std::vector<double> baseline = {1.0 + 1e-3, -2.0, 0.5};
  const std::vector<double> stored_o = {1.0, -2.0, 0.5 - 5e-4};
  const std::vector<float> within = {1.0f + 2.5e-3f, -2.0f, 0.5f};
  const std::vector<float> past = {1.0f, -2.0f + 3e-3f, 0.5f};
  const reference::HalfGradientCheck a = reference::check_half_gradient(within, exact, baseline, stored_o);
  EXPECT_NEAR(a.baseline_max_abs, 1e-3, 1e-6);  // the baseline is compared as floats
  EXPECT_NEAR(a.stored_o_max_abs, 5e-4, 1e-12);
  EXPECT_NEAR(a.bound, 2e-3 + 5e-4 + reference::kHalfGradientSlack, 2e-6);
  EXPECT_TRUE(a.passes()) << a.error.describe();
  EXPECT_FALSE(reference::check_half_gradient(past, exact, baseline, stored_o).passes());
  const std::vector<float> nan = {1.0f, std::numeric_limits<float>::quiet_NaN(), 0.5f};
  EXPECT_FALSE(reference::check_half_gradient(nan, exact, baseline, stored_o).passes());
}

// D from the stored O: the exact gradients in fp32 (where O is not rounded), and off them in bf16.
TEST(ReferenceBackwardWithStoredO, ExactInFp32AndOffInBf16) {
  harness::Problem p = small_problem(2, 2, 64, false);
  const harness::HostInputs in = harness::make_inputs(p, 21);
  const reference::Gradients exact = reference::backward(p, in);
  auto max_diff = [](const std::vector<double>& a, const std::vector<double>& b) {
    double m = 0.0;
    for (size_t e = 0; e < a.size(); ++e) m = std::max(m, std::abs(a[e] - b[e]));
    return m;
  };
  p.dtype = flash::DType::kFp32;
  EXPECT_LT(max_diff(reference::backward_with_stored_o(p, in).dk, exact.dk), 1e-6);
  p.dtype = flash::DType::kBf16;
  const double bf16_diff = max_diff(reference::backward_with_stored_o(p, in).dk, exact.dk);
  EXPECT_GT(bf16_diff, 1e-5);
  EXPECT_LT(bf16_diff, 5e-2);
}

}  // namespace

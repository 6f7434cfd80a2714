// reference.h: attention in fp64 on the CPU, the truth every stage is measured against. Written
// for clarity, not speed: it follows the formulas line by line, with the API's conventions (GQA
// head sharing, bottom-right causal mask, empty rows give O = 0 and lse = -inf).
#pragma once

#include <vector>

#include "harness.h"

namespace reference {

// O and lse of some query rows, in the order they were asked for.
struct ForwardRows {
  std::vector<double> o;    // [rows, head_dim]; zeros for a row that sees no key
  std::vector<double> lse;  // [rows]; -inf for a row that sees no key
};
// O and lse of the picked query rows (flattened (b, h, i) indices, e.g. from harness::sample_rows):
// o is [rows.size(), head_dim], lse is [rows.size()]. Rows run in parallel on the host's cores.
ForwardRows forward_rows(const harness::Problem& p, const harness::HostInputs& in, const std::vector<long long>& rows);

// The same rows computed the way PyTorch's composite (math) attention computes them in a half
// dtype: fp64 arithmetic, but the scores, the probabilities and the output each rounded to p.dtype
// (fp32 = no rounding), where PyTorch stores them in that dtype between its kernels. Its error
// against forward_rows is the error of an honest half-precision attention: the baseline of the
// FlashAttention test rule below.
ForwardRows forward_rows_in_dtype(const harness::Problem& p, const harness::HostInputs& in,
                                  const std::vector<long long>& rows);

// FlashAttention's test rule for half precision (tests/test_flash_attn.py in its repository): the
// output's max error against the exact result may be at most twice that of PyTorch's attention in
// the same dtype, plus a small absolute term. In C++ the PyTorch side is forward_rows_in_dtype.
constexpr double kHalfErrorFactor = 2.0;
// The absolute term of the rule: the bound is kHalfErrorFactor * baseline + kHalfErrorSlack.
constexpr double kHalfErrorSlack = 1e-5;
// What check_half_precision found: the stage's error, the baseline's, and the bound between them.
struct HalfPrecisionCheck {
  harness::ErrorStats error;      // the stage's output against the exact fp64 result
  double baseline_max_abs = 0.0;  // forward_rows_in_dtype's max error against the exact result
  double bound = 0.0;             // kHalfErrorFactor * baseline_max_abs + kHalfErrorSlack
  ForwardRows exact;              // the fp64 rows, for the lse check
  // True when every output is finite and the max error is within the bound.
  bool passes() const { return error.nonfinite == 0 && error.max_abs <= bound; }
};
// The rule applied to got_o, a stage's output at the picked rows ([rows.size(), head_dim]).
HalfPrecisionCheck check_half_precision(const harness::Problem& p, const harness::HostInputs& in,
                                        const std::vector<long long>& rows, const std::vector<float>& got_o);

// Every row: o [batch, heads_q, seq_q, head_dim], lse [batch, heads_q, seq_q].
ForwardRows forward(const harness::Problem& p, const harness::HostInputs& in);

// Gradients of sum(O * d_out) with respect to Q, K, V, shaped like them. With GQA, dK and dV of a
// shared K/V head sum over the query heads that read it.
struct Gradients {
  std::vector<double> dq, dk, dv;  // shaped like q, k, v
};
// The gradients of the whole problem, with in.d_out as dO; recomputes the forward itself, so it
// needs no O or lse. Runs on every host core.
Gradients backward(const harness::Problem& p, const harness::HostInputs& in);

// The same gradients computed the way PyTorch's autograd through its composite (math) attention
// computes them in a half dtype: fp64 arithmetic, but every tensor PyTorch stores in p.dtype between
// its kernels rounded to it: the scores S and the probabilities P of the forward; dP = dO V^T and
// dS = P o (dP - D) of the backward (D = sum_j P_ij dP_ij in fp64, as the softmax backward keeps it
// in fp32); and dQ, dK, dV themselves. Its error against backward() is the error of an honest
// half-precision backward: the baseline of the rule below, as forward_rows_in_dtype is the forward's.
// (PyTorch also rounds q and k after multiplying each by sqrt(scale), an implementation detail left
// out here; the Python tests hold the stages to PyTorch itself.)
Gradients backward_in_dtype(const harness::Problem& p, const harness::HostInputs& in);

// The exact gradients (fp64 throughout) but for one input: D_i, the row sum sum_j P_ij dP_ij, taken
// as dO_i . O_i with O_i rounded to p.dtype. That is how FlashAttention's backward (stage 11's too)
// gets D: from the output its forward stored in the dtype. The rounding of O enters every dS_ij of
// the row; where D - dP_ij cancels (a row of two keys, P near 1/2 each) it is a large part of the
// gradient's error, by design of the algorithm rather than by a fault of its kernels. Its distance from
// backward() is the rule's second term below.
Gradients backward_with_stored_o(const harness::Problem& p, const harness::HostInputs& in);

// The backward's absolute term of the FlashAttention rule: a gradient's max error may be at most
// kHalfErrorFactor times the baseline's plus this. Larger than the forward's kHalfErrorSlack because
// where an exact gradient is zero (one visible key: P = 1, dS = dP - D = 0) the baseline is exact
// too, while an fp32 kernel keeps the rounding of dP - D: d products of fp32 sums of about |dO||V|
// (~sqrt(d) ~ 10), about 1e-6 each, summed over up to a few thousand rows into dK. 1e-4 covers that
// with a factor of 10 and is still about 1% of a typical gradient element.
constexpr double kHalfGradientSlack = 1e-4;
// The rule applied to one gradient: the stage's error and the baseline's against the exact result.
struct HalfGradientCheck {
  harness::ErrorStats error;      // the stage's gradient against the exact fp64 one
  double baseline_max_abs = 0.0;  // backward_in_dtype's max error against the exact one
  double stored_o_max_abs = 0.0;  // backward_with_stored_o's max distance from the exact one
  // kHalfErrorFactor * baseline_max_abs + stored_o_max_abs + kHalfGradientSlack
  double bound = 0.0;
  // True when every element is finite and the max error is within the bound.
  bool passes() const { return error.nonfinite == 0 && error.max_abs <= bound; }
};
// got (a stage's gradient) against exact (backward()'s) with baseline (backward_in_dtype()'s) and
// stored_o (backward_with_stored_o()'s).
HalfGradientCheck check_half_gradient(const std::vector<float>& got, const std::vector<double>& exact,
                                      const std::vector<double>& baseline, const std::vector<double>& stored_o);

}  // namespace reference

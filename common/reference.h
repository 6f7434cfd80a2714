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

}  // namespace reference

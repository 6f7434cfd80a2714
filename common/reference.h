// reference.h: attention in fp64 on the CPU, the truth every stage is measured against. Written
// for clarity, not speed: it follows the formulas line by line, with the API's conventions (GQA
// head sharing, bottom-right causal mask, empty rows give O = 0 and lse = -inf).
#pragma once

#include <vector>

#include "harness.h"

namespace reference {

// O and lse of the picked query rows (flattened (b, h, i) indices): o is [rows.size(), head_dim],
// lse is [rows.size()]. Rows run in parallel on the host's cores.
struct ForwardRows {
  std::vector<double> o;
  std::vector<double> lse;
};
ForwardRows forward_rows(const harness::Problem& p, const harness::HostInputs& in, const std::vector<long long>& rows);

// Every row: o [batch, heads_q, seq_q, head_dim], lse [batch, heads_q, seq_q].
ForwardRows forward(const harness::Problem& p, const harness::HostInputs& in);

// Gradients of sum(O * d_out) with respect to Q, K, V, shaped like them. With GQA, dK and dV of a
// shared K/V head sum over the query heads that read it.
struct Gradients {
  std::vector<double> dq, dk, dv;
};
Gradients backward(const harness::Problem& p, const harness::HostInputs& in);

}  // namespace reference

#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

namespace reference {
namespace {

struct RowIndex {
  long long q_offset;   // start of the query row in q / o
  long long kv_offset;  // start of its K/V head in k / v
  int query;            // i
  int key_end;          // keys [0, key_end) are visible
};

RowIndex index_row(const harness::Problem& p, long long row) {
  const long long bh = row / p.seq_q;
  const int b = static_cast<int>(bh / p.heads_q);
  const int h = static_cast<int>(bh % p.heads_q);
  const int group = p.heads_q / p.heads_kv;
  RowIndex r;
  r.query = static_cast<int>(row % p.seq_q);
  r.q_offset = row * p.head_dim;
  r.kv_offset = (static_cast<long long>(b) * p.heads_kv + h / group) * p.seq_kv * p.head_dim;
  r.key_end = p.causal ? std::clamp(r.query + (p.seq_kv - p.seq_q) + 1, 0, p.seq_kv) : p.seq_kv;
  return r;
}

// Scaled scores of one row over its visible keys.
std::vector<double> row_scores(const harness::Problem& p, const harness::HostInputs& in, const RowIndex& r) {
  std::vector<double> s(r.key_end);
  for (int j = 0; j < r.key_end; ++j) {
    double dot = 0.0;
    for (int c = 0; c < p.head_dim; ++c)
      dot += static_cast<double>(in.q[r.q_offset + c]) * in.k[r.kv_offset + static_cast<long long>(j) * p.head_dim + c];
    s[j] = p.softmax_scale() * dot;
  }
  return s;
}

// Softmax of the scores in place (safe: max subtracted); returns the lse.
double softmax_in_place(std::vector<double>& s) {
  if (s.empty()) return -std::numeric_limits<double>::infinity();
  const double m = *std::max_element(s.begin(), s.end());
  double sum = 0.0;
  for (double& x : s) sum += (x = std::exp(x - m));
  for (double& x : s) x /= sum;
  return m + std::log(sum);
}

// Runs body(i) for i in [0, n) on every core.
template <typename Body>
void parallel_for(long long n, Body body) {
  const long long workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (long long w = 0; w < workers; ++w)
    pool.emplace_back([=] {
      for (long long i = w; i < n; i += workers) body(i);
    });
  for (auto& t : pool) t.join();
}

}  // namespace

namespace {

// The fp64 forward of the picked rows; with rounded = true, the scores, the probabilities and the
// output are each rounded to p.dtype where PyTorch's composite attention stores them in that dtype.
ForwardRows forward_rows_impl(const harness::Problem& p, const harness::HostInputs& in,
                              const std::vector<long long>& rows, bool rounded) {
  auto stored = [&](double x) {
    return rounded ? static_cast<double>(harness::round_to(p.dtype, static_cast<float>(x))) : x;
  };
  ForwardRows out;
  out.o.assign(rows.size() * p.head_dim, 0.0);
  out.lse.assign(rows.size(), 0.0);
  parallel_for(static_cast<long long>(rows.size()), [&](long long n) {
    const RowIndex r = index_row(p, rows[n]);
    std::vector<double> prob = row_scores(p, in, r);
    for (double& s : prob) s = stored(s);
    out.lse[n] = softmax_in_place(prob);
    for (double& x : prob) x = stored(x);
    for (int j = 0; j < r.key_end; ++j)
      for (int c = 0; c < p.head_dim; ++c)
        out.o[n * p.head_dim + c] += prob[j] * in.v[r.kv_offset + static_cast<long long>(j) * p.head_dim + c];
    for (int c = 0; c < p.head_dim; ++c) out.o[n * p.head_dim + c] = stored(out.o[n * p.head_dim + c]);
  });
  return out;
}

}  // namespace

ForwardRows forward_rows(const harness::Problem& p, const harness::HostInputs& in, const std::vector<long long>& rows) {
  return forward_rows_impl(p, in, rows, false);
}

ForwardRows forward_rows_in_dtype(const harness::Problem& p, const harness::HostInputs& in,
                                  const std::vector<long long>& rows) {
  return forward_rows_impl(p, in, rows, true);
}

HalfPrecisionCheck check_half_precision(const harness::Problem& p, const harness::HostInputs& in,
                                        const std::vector<long long>& rows, const std::vector<float>& got_o) {
  const ForwardRows exact = forward_rows(p, in, rows);
  const ForwardRows baseline = forward_rows_in_dtype(p, in, rows);
  std::vector<float> baseline_o(baseline.o.begin(), baseline.o.end());
  HalfPrecisionCheck c;
  c.error = harness::compare(got_o, exact.o);
  c.baseline_max_abs = harness::compare(baseline_o, exact.o).max_abs;
  c.bound = kHalfErrorFactor * c.baseline_max_abs + kHalfErrorSlack;
  c.exact = exact;
  return c;
}

ForwardRows forward(const harness::Problem& p, const harness::HostInputs& in) {
  return forward_rows(p, in, harness::sample_rows(p.rows(), p.rows()));
}

// For one row with probabilities P and upstream gradient dO:
//   dV_j += P_j dO;   dP_j = dO . V_j;   dS_j = P_j (dP_j - sum_k P_k dP_k);
//   dQ += scale sum_j dS_j K_j;   dK_j += scale dS_j Q.
// The rows of one (b, kv head) group are cut into parts, each processed by one thread: dQ rows have
// one writer, and each part sums dK / dV into its own partial, added up in part order afterwards (the
// same order whatever the thread count). The long cases of the tests have a single head, so one thread
// per group would leave the host's other cores idle.
// With rounded = true, S, P, dP, dS and the gradients are each rounded to p.dtype where PyTorch stores
// them in that dtype (backward_in_dtype).
namespace {

// Parts per group: at most 16, and their partial dK / dV together at most 256 MiB.
constexpr int kMaxRowParts = 16;
constexpr double kMaxPartialBytes = 256.0 * (1 << 20);

// rounded: backward_in_dtype's roundings; d_from_stored_o: backward_with_stored_o's D.
Gradients backward_impl(const harness::Problem& p, const harness::HostInputs& in, bool rounded, bool d_from_stored_o) {
  auto stored = [&](double x) {
    return rounded ? static_cast<double>(harness::round_to(p.dtype, static_cast<float>(x))) : x;
  };
  Gradients g;
  g.dq.assign(in.q.size(), 0.0);
  g.dk.assign(in.k.size(), 0.0);
  g.dv.assign(in.v.size(), 0.0);
  const int group = p.heads_q / p.heads_kv;
  const double scale = p.softmax_scale();
  const long long groups = static_cast<long long>(p.batch) * p.heads_kv;
  const long long group_rows = static_cast<long long>(group) * p.seq_q;
  const long long kv_elems = static_cast<long long>(p.seq_kv) * p.head_dim;  // one group's K (or V)
  const double bytes_per_part = 2.0 * sizeof(double) * static_cast<double>(groups * kv_elems);
  const int parts = static_cast<int>(
      std::clamp<double>(std::min<double>(kMaxPartialBytes / bytes_per_part, group_rows), 1.0, kMaxRowParts));
  std::vector<double> part_dk(static_cast<size_t>(groups * parts * kv_elems), 0.0);
  std::vector<double> part_dv(part_dk.size(), 0.0);
  parallel_for(groups * parts, [&](long long item) {
    const long long kv_head = item / parts, part = item % parts;
    const long long b = kv_head / p.heads_kv;
    const long long first_row = (b * p.heads_q + (kv_head % p.heads_kv) * group) * p.seq_q;
    double* dk = part_dk.data() + item * kv_elems;
    double* dv = part_dv.data() + item * kv_elems;
    for (long long row = first_row + group_rows * part / parts; row < first_row + group_rows * (part + 1) / parts;
         ++row) {
      const RowIndex r = index_row(p, row);
      const long long kv_base = r.kv_offset;  // dk / dv above are this group's slices
      std::vector<double> prob = row_scores(p, in, r);
      for (double& s : prob) s = stored(s);
      softmax_in_place(prob);
      for (double& x : prob) x = stored(x);
      std::vector<double> dp(r.key_end, 0.0);
      double p_dot_dp = 0.0;
      for (int j = 0; j < r.key_end; ++j) {
        const long long kv = static_cast<long long>(j) * p.head_dim;
        for (int c = 0; c < p.head_dim; ++c) {
          const double d_out = in.d_out[r.q_offset + c];
          dv[kv + c] += prob[j] * d_out;
          dp[j] += d_out * in.v[kv_base + kv + c];
        }
        dp[j] = stored(dp[j]);
        p_dot_dp += prob[j] * dp[j];
      }
      if (d_from_stored_o) {  // D = dO . O, O as the forward stores it
        p_dot_dp = 0.0;
        for (int c = 0; c < p.head_dim; ++c) {
          double o = 0.0;
          for (int j = 0; j < r.key_end; ++j) o += prob[j] * in.v[kv_base + static_cast<long long>(j) * p.head_dim + c];
          p_dot_dp += static_cast<double>(in.d_out[r.q_offset + c]) * harness::round_to(p.dtype, static_cast<float>(o));
        }
      }
      for (int j = 0; j < r.key_end; ++j) {
        const long long kv = static_cast<long long>(j) * p.head_dim;
        const double ds = stored(prob[j] * (dp[j] - p_dot_dp));
        for (int c = 0; c < p.head_dim; ++c) {
          g.dq[r.q_offset + c] += scale * ds * in.k[kv_base + kv + c];
          dk[kv + c] += scale * ds * in.q[r.q_offset + c];
        }
      }
    }
  });
  parallel_for(groups, [&](long long kv_head) {
    double* dk = g.dk.data() + kv_head * kv_elems;
    double* dv = g.dv.data() + kv_head * kv_elems;
    for (int part = 0; part < parts; ++part) {
      const long long item = kv_head * parts + part;
      for (long long e = 0; e < kv_elems; ++e) {
        dk[e] += part_dk[item * kv_elems + e];
        dv[e] += part_dv[item * kv_elems + e];
      }
    }
  });
  if (rounded)
    for (std::vector<double>* t : {&g.dq, &g.dk, &g.dv})
      for (double& x : *t) x = stored(x);
  return g;
}

}  // namespace

Gradients backward(const harness::Problem& p, const harness::HostInputs& in) {
  return backward_impl(p, in, false, false);
}

Gradients backward_in_dtype(const harness::Problem& p, const harness::HostInputs& in) {
  return backward_impl(p, in, true, false);
}

Gradients backward_with_stored_o(const harness::Problem& p, const harness::HostInputs& in) {
  return backward_impl(p, in, false, true);
}

HalfGradientCheck check_half_gradient(const std::vector<float>& got, const std::vector<double>& exact,
                                      const std::vector<double>& baseline, const std::vector<double>& stored_o) {
  const std::vector<float> baseline_f(baseline.begin(), baseline.end());
  HalfGradientCheck c;
  c.error = harness::compare(got, exact);
  c.baseline_max_abs = harness::compare(baseline_f, exact).max_abs;
  for (size_t e = 0; e < exact.size(); ++e)
    c.stored_o_max_abs = std::max(c.stored_o_max_abs, std::abs(stored_o[e] - exact[e]));
  c.bound = kHalfErrorFactor * c.baseline_max_abs + c.stored_o_max_abs + kHalfGradientSlack;
  return c;
}

}  // namespace reference

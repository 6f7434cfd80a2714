// Stage 13 (decoding) on the GPU, on decode shapes: a few query rows against caches of 1 to more than
// a million keys, MHA, GQA and MQA, causal and not, both dtypes, both head_dims; and its paged cache
// against the contiguous path. Held to FlashAttention's half-precision rule against the fp64
// reference (reference::check_half_precision) and to the agreement tolerance against stage 10 on the
// same inputs, like stages 08-10. Outputs and the workspace are poisoned with NaN before each run, so
// an element the kernels forget to write, or a partial the merge reads before it is written, fails.
// Every test name carries "stage13", so `ctest -L stage13` runs them with the stage's other tests.
// The sweeps are chosen cases by default and exhaustive with FLASH_TEST_SWEEP=full
// (stage_params::full_sweep; `ctest -L full`).
// Without a GPU every test here skips with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "13_decoding/decoding.h"
#include "reference.h"
#include "registry.h"
#include "stage_params.h"

namespace {

using flash::DType;

constexpr uint64_t kSeed = 13;
// Problem's scale for "the usual 1 / sqrt(head_dim)" (harness::Problem::softmax_scale).
constexpr float kDefaultScale = std::numeric_limits<float>::quiet_NaN();
// lse of a half stage: fp32 sums and ex2.approx (as in test_stages_gpu.cpp).
constexpr double kHalfLseTolerance = 1e-4;
// Host multiply-adds the fp64 reference may spend per case; past this it checks a spread sample of
// rows (at least 64) and stage 10 covers every element.
constexpr double kReferenceMacs = 1 << 26;

const registry::Stage& decoding() { return *registry::find(13); }

// Problems below are written {batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, causal, scale, dtype},
// scale kDefaultScale for 1 / sqrt(head_dim).

std::string problem_name(const harness::Problem& p) {
  std::ostringstream s;
  s << "stage13_d" << p.head_dim << "_b" << p.batch << "h" << p.heads_q << "kv" << p.heads_kv << "_q" << p.seq_q
    << "_k" << p.seq_kv << (p.causal ? "_causal" : "") << "_" << flash::dtype_name(p.dtype);
  return s.str();
}

// Inputs are the slow part on the host (a normal deviate per element): the last ones are kept, and
// the sweep runs causal and not back to back on the same inputs.
const harness::HostInputs& inputs_for(const harness::Problem& p,
                                      harness::InputKind kind = harness::InputKind::kNormal) {
  static harness::Problem cached_problem;
  static harness::InputKind cached_kind = harness::InputKind::kNormal;
  static std::unique_ptr<harness::HostInputs> cached;
  harness::Problem key = p;  // the inputs do not depend on causal or the scale
  key.causal = false;
  const bool same = cached && cached_kind == kind && key.describe() == cached_problem.describe();
  if (!same) {
    cached.reset();
    cached = std::make_unique<harness::HostInputs>(harness::make_inputs(key, kSeed, kind));
    cached_problem = key;
    cached_kind = kind;
  }
  return *cached;
}

// What one stage 13 call brought back.
struct Result {
  flash::Status status;
  std::vector<float> o, lse;
};

// stage13::forward on p with outputs and workspace poisoned (NaN) first; synchronized.
Result run_contiguous(const harness::Problem& p, const harness::DeviceInputs& in) {
  harness::DeviceTensor o(p.dtype, static_cast<size_t>(p.q_elems()));
  harness::DeviceBuffer<float> lse(p.rows());
  harness::DeviceBuffer<unsigned char> workspace(
      stage13::forward_workspace_size(p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim));
  o.poison();
  lse.poison();
  if (workspace.size() > 0) workspace.poison();
  Result r;
  r.status = stage13::forward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv,
                              p.seq_q, p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, p.dtype, workspace.get(),
                              workspace.bytes(), nullptr);
  if (r.status.ok()) r.status = flash::cuda_status(cudaDeviceSynchronize());
  if (!r.status.ok()) return r;
  r.o = o.download();
  r.lse = lse.download();
  return r;
}

// O and lse at the picked rows against the fp64 reference, by the half-precision rule.
void expect_matches_reference(const harness::Problem& p, const harness::HostInputs& host, const std::vector<float>& o,
                              const std::vector<float>& lse, const std::vector<long long>& rows) {
  const std::vector<float> got_o = harness::gather_rows(o, rows, p.head_dim);
  const std::vector<float> got_lse = harness::gather_rows(lse, rows, 1);
  const reference::HalfPrecisionCheck check = reference::check_half_precision(p, host, rows, got_o);
  EXPECT_TRUE(check.passes()) << "O vs reference: " << check.error.describe() << ", allowed max_abs " << check.bound
                              << " (twice the " << check.baseline_max_abs << " of attention computed in "
                              << flash::dtype_name(p.dtype) << ", plus " << reference::kHalfErrorSlack << ")";
  const harness::ErrorStats lse_err = harness::compare(got_lse, check.exact.lse);
  EXPECT_TRUE(lse_err.within(kHalfLseTolerance)) << "lse vs reference: " << lse_err.describe();
}

std::vector<long long> reference_rows(const harness::Problem& p) {
  const long long budget = static_cast<long long>(kReferenceMacs / (2.0 * p.seq_kv * p.head_dim));
  return harness::sample_rows(p.rows(), std::max(64LL, budget));
}

// The fixtures' SetUp: without a GPU, or on one older than stage 13 needs (8.0), every test skips,
// saying what was found.
#define STAGE13_REQUIRE_GPU()                                                                            \
  do {                                                                                                   \
    std::string why;                                                                                     \
    if (!harness::gpu_available(&why)) GTEST_SKIP() << why;                                              \
    const flash::Status cc = flash::check_compute_capability(decoding().min_compute_capability);         \
    if (cc.code == flash::StatusCode::kArchNotSupported) GTEST_SKIP() << "stage13: " << flash::to_string(cc); \
  } while (0)

// ---------------------------------------------------------------------------------------------
// The sweep: cache lengths, batch sizes, query rows, GQA ratios, causal, dtypes, head_dims
// ---------------------------------------------------------------------------------------------

// Each shape in both dtypes, causal and not.
void add_both_dtypes_and_masks(std::vector<harness::Problem>* cases, int batch, int heads_q, int heads_kv, int seq_q,
                               int seq_kv, int head_dim) {
  for (DType dtype : {DType::kBf16, DType::kFp16})
    for (bool causal : {false, true})  // innermost: the two share their inputs
      cases->push_back({batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, causal, kDefaultScale, dtype});
}

// The exhaustive sweep (FLASH_TEST_SWEEP=full).
std::vector<harness::Problem> full_decode_sweep() {
  std::vector<harness::Problem> cases;
  auto add = [&](int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim) {
    add_both_dtypes_and_masks(&cases, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim);
  };
  // GQA ratios 1, 4 and 8 and MQA, at every length up to 4097: batch, heads_q, heads_kv.
  const int heads[][3] = {{1, 4, 4}, {2, 16, 4}, {3, 16, 2}, {2, 8, 1}};
  for (int seq_kv : {1, 7, 255, 4097})
    for (const auto& h : heads)
      for (int seq_q : {1, 3, 16})
        for (int head_dim : {64, 128}) add(h[0], h[1], h[2], seq_q, seq_kv, head_dim);
  // 65537 keys: one sequence, GQA 4 and MQA.
  for (const auto& h : {std::array<int, 3>{1, 8, 2}, std::array<int, 3>{1, 8, 1}})
    for (int seq_q : {1, 16})
      for (int head_dim : {64, 128}) add(h[0], h[1], h[2], seq_q, 65537, head_dim);
  // Large batches: 64 and 256 sequences, the measured GQA 32/8.
  add(64, 32, 8, 1, 255, 128);
  add(256, 32, 8, 1, 7, 128);
  add(256, 8, 2, 2, 255, 64);
  return cases;
}

// The default sweep, every case one of the full sweep's, in both dtypes, causal and not, at both
// head_dims. A block holds one 16-row tile of a K/V group's heads_q / heads_kv * seq_q query rows
// and steps over 64 keys; a sequence's keys are cut into splits of at least 256 keys, merged after,
// unless the grid would pass kMaxSplitBlocks blocks. The shapes (batch, heads_q, heads_kv, seq_q,
// seq_kv) and the paths they take:
//   {1,4,4, 1, 1}        one key, one query row per group: a tile of 1 row in 16, one partial step, no split.
//   {2,16,4, 16, 7}      GQA 4, 64 rows a group (4 full tiles); causal rows 0-8 see no key (O = 0, lse = -inf).
//   {3,16,2, 3, 255}     GQA 8, 24 rows a group (a full tile and a partial one); 255 keys, one split,
//                        a partial last step.
//   {2,8,1, 16, 4097}    MQA, 128 rows a group (8 tiles); 4097 keys in several splits and the merge,
//                        a last step of one key.
//   {1,8,2, 16, 65537}   65537 keys: up to 256 splits (one head dim per dtype and mask).
//   {256,32,8, 1, 7}     256 * 8 (sequence, K/V head) pairs of one row tile each: past kMaxSplitBlocks,
//                        so one split however long the cache.
std::vector<harness::Problem> default_decode_sweep() {
  std::vector<harness::Problem> cases;
  for (int head_dim : {64, 128}) {
    add_both_dtypes_and_masks(&cases, 1, 4, 4, 1, 1, head_dim);
    add_both_dtypes_and_masks(&cases, 2, 16, 4, 16, 7, head_dim);
    add_both_dtypes_and_masks(&cases, 3, 16, 2, 3, 255, head_dim);
    add_both_dtypes_and_masks(&cases, 2, 8, 1, 16, 4097, head_dim);
  }
  add_both_dtypes_and_masks(&cases, 1, 8, 2, 16, 65537, 64);
  add_both_dtypes_and_masks(&cases, 256, 32, 8, 1, 7, 128);
  return cases;
}

std::vector<harness::Problem> decode_sweep() {
  return stage_params::full_sweep() ? full_decode_sweep() : default_decode_sweep();
}

class DecodeSweep : public ::testing::TestWithParam<harness::Problem> {
 protected:
  void SetUp() override { STAGE13_REQUIRE_GPU(); }
};

std::string sweep_name(const ::testing::TestParamInfo<harness::Problem>& info) { return problem_name(info.param); }

TEST_P(DecodeSweep, MatchesReferenceAndStage10) {
  const harness::Problem& p = GetParam();
  const harness::HostInputs& host = inputs_for(p);
  const harness::DeviceInputs dev(host, p.dtype);
  const Result got = run_contiguous(p, dev);
  ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
  EXPECT_EQ(harness::count_nonfinite(got.o), 0u) << "unwritten or non-finite output";
  expect_matches_reference(p, host, got.o, got.lse, reference_rows(p));

  // Every element against stage 10 (no splits, one pass over the keys) on the same inputs.
  const registry::Stage* prev = registry::previous(decoding(), p);
  ASSERT_NE(prev, nullptr);
  ASSERT_EQ(prev->number, 10);
  const registry::ForwardResult before = registry::run_forward(*prev, p, dev);
  ASSERT_TRUE(before.status.ok()) << flash::to_string(before.status);
  const harness::ErrorStats err = harness::compare(got.o, before.o);
  const double tolerance = harness::agreement_tolerance(p.dtype, p.dtype);
  EXPECT_TRUE(err.within(tolerance)) << "O vs stage 10: " << err.describe() << " (allowed " << tolerance << ")";
  EXPECT_TRUE(harness::compare(got.lse, before.lse).within(kHalfLseTolerance))
      << "lse vs stage 10: " << harness::compare(got.lse, before.lse).describe();
}

INSTANTIATE_TEST_SUITE_P(Decode, DecodeSweep, ::testing::ValuesIn(decode_sweep()), sweep_name);

// Every number of query rows from 1 to 16, causal (each new query sees the cache and the new queries
// before it), on one cache. By default (GQA 4: 4 * seq_q rows a group) the counts where the rows
// cross a 16-row tile: 1 (4 rows), 4 (one full tile), 5 (a second tile of 4 rows), 12, 16 (3 and 4
// full tiles).
std::vector<harness::Problem> every_seq_q() {
  std::vector<harness::Problem> cases;
  for (int seq_q = 1; seq_q <= stage13::kMaxSeqQ; ++seq_q) {
    const bool tile_boundary = seq_q == 1 || seq_q == 4 || seq_q == 5 || seq_q == 12 || seq_q == 16;
    if (stage_params::full_sweep() || tile_boundary)
      cases.push_back({2, 8, 2, seq_q, 300, 64, true, kDefaultScale, DType::kBf16});
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(EverySeqQ, DecodeSweep, ::testing::ValuesIn(every_seq_q()), sweep_name);

// ---------------------------------------------------------------------------------------------
// Single tests: determinism, the longest cache, extreme scores, any scale, hidden keys
// ---------------------------------------------------------------------------------------------

class Stage13 : public ::testing::Test {
 protected:
  void SetUp() override { STAGE13_REQUIRE_GPU(); }
};

// The same inputs twice give the same bits: the partials are merged in split order, no atomics.
// The shape has many splits, so the merge really runs.
TEST_F(Stage13, stage13_IsDeterministic) {
  for (const harness::Problem& p : {harness::Problem{2, 32, 8, 1, 16384, 128, false, kDefaultScale, DType::kBf16},
                                    harness::Problem{1, 8, 2, 16, 20000, 64, true, kDefaultScale, DType::kFp16}}) {
    ASSERT_GT(stage13::max_splits(p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv), 1) << p.describe();
    const harness::DeviceInputs dev(inputs_for(p), p.dtype);
    const Result first = run_contiguous(p, dev);
    const Result second = run_contiguous(p, dev);
    ASSERT_TRUE(first.status.ok() && second.status.ok());
    EXPECT_EQ(0, std::memcmp(first.o.data(), second.o.data(), first.o.size() * sizeof(float))) << p.describe();
    EXPECT_EQ(0, std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * sizeof(float))) << p.describe();
  }
}

// More than a million keys: one sequence, MQA (4 query heads on one K/V head), two new queries.
TEST_F(Stage13, stage13_MillionKeyCacheMatchesReference) {
  const harness::Problem p{1, 4, 1, 2, (1 << 20) + 3, 64, true, kDefaultScale, DType::kBf16};
  const harness::HostInputs& host = inputs_for(p);
  const harness::DeviceInputs dev(host, p.dtype);
  const Result got = run_contiguous(p, dev);
  ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
  EXPECT_EQ(harness::count_nonfinite(got.o), 0u);
  expect_matches_reference(p, host, got.o, got.lse, harness::sample_rows(p.rows(), p.rows()));
}

// Extreme inputs: scaled scores reach several hundred, past expf's overflow near 88.7.
TEST_F(Stage13, stage13_ExtremeScoresStayFiniteAndCorrect) {
  for (DType dtype : {DType::kBf16, DType::kFp16})
    for (bool causal : {false, true}) {
      const harness::Problem p{2, 8, 2, 3, 1000, 64, causal, kDefaultScale, dtype};
      const harness::HostInputs& host = inputs_for(p, harness::InputKind::kExtreme);
      const Result got = run_contiguous(p, harness::DeviceInputs(host, dtype));
      ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
      SCOPED_TRACE(p.describe());
      EXPECT_EQ(harness::count_nonfinite(got.o), 0u);
      expect_matches_reference(p, host, got.o, got.lse, harness::sample_rows(p.rows(), p.rows()));
    }
}

// The scale is any finite number: negative (the softmax then favours the smallest scores, and a
// kernel that scales masked -inf goes wrong) and large.
TEST_F(Stage13, stage13_AnyScaleMatchesReference) {
  for (float scale : {-0.2f, 1.5f}) {
    harness::Problem p{2, 8, 2, 5, 3000, 128, true, scale, DType::kBf16};
    const harness::HostInputs& host = inputs_for(p);
    const Result got = run_contiguous(p, harness::DeviceInputs(host, p.dtype));
    ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
    SCOPED_TRACE("scale " + std::to_string(scale));
    expect_matches_reference(p, host, got.o, got.lse, harness::sample_rows(p.rows(), p.rows()));
  }
}

// Causal independence: replacing K and V from key `cut` on leaves each row that stops before `cut`
// bit for bit unchanged (its masked keys add exact zeros in whatever split holds them) and changes
// the rows that see past it.
TEST_F(Stage13, stage13_HiddenKeysDoNotAffectOutput) {
  for (int seq_kv : {300, 5000}) {
    const harness::Problem p{2, 8, 2, 16, seq_kv, 64, true, kDefaultScale, DType::kBf16};
    const int cut = seq_kv - p.seq_q + p.seq_q / 2;
    harness::HostInputs host = harness::make_inputs(p, kSeed);
    const Result before = run_contiguous(p, harness::DeviceInputs(host, p.dtype));
    const harness::HostInputs other = harness::make_inputs(p, kSeed + 1);
    for (long long e = 0; e < p.kv_elems(); ++e)
      if ((e / p.head_dim) % seq_kv >= cut) {
        host.k[e] = other.k[e];
        host.v[e] = other.v[e];
      }
    const Result after = run_contiguous(p, harness::DeviceInputs(host, p.dtype));
    ASSERT_TRUE(before.status.ok() && after.status.ok());
    long long unchanged_rows = 0, changed_rows = 0;
    for (long long row = 0; row < p.rows(); ++row) {
      const int query = static_cast<int>(row % p.seq_q);
      const bool same = std::memcmp(&before.o[row * p.head_dim], &after.o[row * p.head_dim],
                                    p.head_dim * sizeof(float)) == 0 &&
                        std::memcmp(&before.lse[row], &after.lse[row], sizeof(float)) == 0;
      if (flash::causal_key_end(query, p.seq_q, seq_kv) <= cut) {
        EXPECT_TRUE(same) << "row " << row << " sees no key past " << cut << " but changed (" << p.describe() << ")";
        ++unchanged_rows;
      } else if (!same) {
        ++changed_rows;
      }
    }
    EXPECT_GT(unchanged_rows, 0) << p.describe();
    EXPECT_GT(changed_rows, 0) << p.describe();
  }
}

// ---------------------------------------------------------------------------------------------
// The paged cache against the contiguous path and the reference
// ---------------------------------------------------------------------------------------------

// One batch of sequences of different lengths in one paged cache.
struct PagedCase {
  int heads_q, heads_kv, seq_q, head_dim, page_size;
  bool causal;
  DType dtype;
};

// Lengths in one batch: 1 key, a few, one page and a bit, an empty sequence (its rows see nothing),
// a long one, one under the query rows (causal rows that see nothing).
const std::vector<int> kPagedLengths = {1, 7, 255, 0, 4097, 2};

std::string paged_name(const ::testing::TestParamInfo<PagedCase>& info) {
  const PagedCase& c = info.param;
  std::ostringstream s;
  s << "stage13_paged_d" << c.head_dim << "_h" << c.heads_q << "kv" << c.heads_kv << "_q" << c.seq_q << "_page"
    << c.page_size << (c.causal ? "_causal" : "") << "_" << flash::dtype_name(c.dtype);
  return s.str();
}

// Every page size, head_dim, GQA ratio, mask and dtype together (FLASH_TEST_SWEEP=full), or by default
// six of them: each page size at both head_dims, each with GQA 4 and MQA, causal and not, bf16 and
// fp16, and every pair of head_dim and dtype, of mask and dtype, once at least. The batch of
// kPagedLengths is the same in all: empty, one-key and multi-page sequences in one call.
std::vector<PagedCase> paged_cases() {
  if (!stage_params::full_sweep())
    return {{8, 2, 3, 64, 16, true, DType::kBf16},   {8, 1, 3, 128, 16, false, DType::kFp16},
            {8, 2, 3, 128, 64, false, DType::kBf16}, {8, 1, 3, 64, 64, true, DType::kFp16},
            {8, 2, 3, 64, 256, false, DType::kFp16}, {8, 1, 3, 128, 256, true, DType::kBf16}};
  std::vector<PagedCase> cases;
  for (int page_size : {16, 64, 256})
    for (int head_dim : {64, 128})
      for (const auto& [heads_q, heads_kv] : {std::pair{8, 2}, std::pair{8, 1}})
        for (bool causal : {false, true})
          for (DType dtype : {DType::kBf16, DType::kFp16})
            cases.push_back({heads_q, heads_kv, 3, head_dim, page_size, causal, dtype});
  return cases;
}

// A paged cache built on the host from each sequence's contiguous inputs: the pages in a shuffled
// order, every key slot that no sequence owns (the tail of a last page, spare pages) NaN, and every
// page-table entry past a sequence's pages far out of range. A kernel that reads past a length, or
// looks up a page it should not, returns NaN or faults.
struct HostPagedCache {
  int batch = 0, max_pages_per_seq = 0, num_pages = 0;
  std::vector<harness::Problem> problems;  // sequence b alone, contiguous (seq_kv >= 1 even when empty)
  std::vector<harness::HostInputs> inputs;
  std::vector<float> q, k_pages, v_pages;
  std::vector<int> page_table, cache_lens;
};

HostPagedCache build_paged(const PagedCase& c, const std::vector<int>& lengths) {
  HostPagedCache cache;
  cache.batch = static_cast<int>(lengths.size());
  int max_len = 0, needed = 0;
  for (int len : lengths) {
    max_len = std::max(max_len, len);
    needed += (len + c.page_size - 1) / c.page_size;
  }
  cache.max_pages_per_seq = (max_len + c.page_size - 1) / c.page_size + 1;  // one spare column
  cache.num_pages = needed + 3;                                              // three spare pages
  std::vector<int> order(cache.num_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(kSeed));
  const size_t row = static_cast<size_t>(c.heads_kv) * c.head_dim;  // one key slot of a page: every K/V head
  cache.k_pages.assign(static_cast<size_t>(cache.num_pages) * c.page_size * row, NAN);
  cache.v_pages.assign(cache.k_pages.size(), NAN);
  cache.page_table.assign(static_cast<size_t>(cache.batch) * cache.max_pages_per_seq, 1 << 30);
  cache.cache_lens = lengths;
  int next_page = 0;
  for (int b = 0; b < cache.batch; ++b) {
    const int len = lengths[b];
    const harness::Problem p{1, c.heads_q, c.heads_kv, c.seq_q, std::max(len, 1), c.head_dim, c.causal,
                             kDefaultScale, c.dtype};
    harness::HostInputs in = harness::make_inputs(p, kSeed + 100 + b);
    cache.q.insert(cache.q.end(), in.q.begin(), in.q.end());
    for (int j = 0; j < len; ++j) {
      if (j % c.page_size == 0) cache.page_table[static_cast<size_t>(b) * cache.max_pages_per_seq + j / c.page_size] =
                                    order[next_page++];
      const int page = cache.page_table[static_cast<size_t>(b) * cache.max_pages_per_seq + j / c.page_size];
      for (int h = 0; h < c.heads_kv; ++h) {
        const size_t from = (static_cast<size_t>(h) * p.seq_kv + j) * c.head_dim;
        const size_t to = ((static_cast<size_t>(page) * c.page_size + j % c.page_size) * c.heads_kv + h) * c.head_dim;
        std::copy_n(&in.k[from], c.head_dim, &cache.k_pages[to]);
        std::copy_n(&in.v[from], c.head_dim, &cache.v_pages[to]);
      }
    }
    cache.problems.push_back(p);
    cache.inputs.push_back(std::move(in));
  }
  return cache;
}

class PagedDecode : public ::testing::TestWithParam<PagedCase> {
 protected:
  void SetUp() override { STAGE13_REQUIRE_GPU(); }
};

// forward_paged on the cache, outputs and workspace poisoned first; synchronized.
Result run_paged(const PagedCase& c, const HostPagedCache& cache) {
  const harness::DeviceTensor q(c.dtype, cache.q), k(c.dtype, cache.k_pages), v(c.dtype, cache.v_pages);
  const harness::DeviceBuffer<int> table(cache.page_table), lens(cache.cache_lens);
  const size_t rows = static_cast<size_t>(cache.batch) * c.heads_q * c.seq_q;
  harness::DeviceTensor o(c.dtype, rows * c.head_dim);
  harness::DeviceBuffer<float> lse(rows);
  harness::DeviceBuffer<unsigned char> workspace(stage13::forward_paged_workspace_size(
      cache.batch, c.heads_q, c.heads_kv, c.seq_q, c.head_dim, c.page_size, cache.max_pages_per_seq));
  o.poison();
  lse.poison();
  if (workspace.size() > 0) workspace.poison();
  Result r;
  r.status = stage13::forward_paged(q.get(), k.get(), v.get(), table.get(), lens.get(), o.get(), lse.get(),
                                    cache.batch, c.heads_q, c.heads_kv, c.seq_q, c.head_dim, c.page_size,
                                    cache.num_pages, cache.max_pages_per_seq, 1.0f / std::sqrt(float(c.head_dim)),
                                    c.causal, c.dtype, workspace.get(), workspace.bytes(), nullptr);
  if (r.status.ok()) r.status = flash::cuda_status(cudaDeviceSynchronize());
  if (!r.status.ok()) return r;
  r.o = o.download();
  r.lse = lse.download();
  return r;
}

TEST_P(PagedDecode, MatchesContiguousAndReference) {
  const PagedCase& c = GetParam();
  const HostPagedCache cache = build_paged(c, kPagedLengths);
  const Result paged = run_paged(c, cache);
  ASSERT_TRUE(paged.status.ok()) << flash::to_string(paged.status);
  const size_t rows_per_seq = static_cast<size_t>(c.heads_q) * c.seq_q;
  for (int b = 0; b < cache.batch; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b) + " of length " + std::to_string(cache.cache_lens[b]));
    const std::vector<float> o(paged.o.begin() + b * rows_per_seq * c.head_dim,
                               paged.o.begin() + (b + 1) * rows_per_seq * c.head_dim);
    const std::vector<float> lse(paged.lse.begin() + b * rows_per_seq, paged.lse.begin() + (b + 1) * rows_per_seq);
    EXPECT_EQ(harness::count_nonfinite(o), 0u) << "unwritten or non-finite output";
    if (cache.cache_lens[b] == 0) {  // no key at all: zeros and -inf
      EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](float x) { return x == 0.0f; }));
      EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return x == -INFINITY; }));
      continue;
    }
    const harness::Problem& p = cache.problems[b];
    const Result contiguous = run_contiguous(p, harness::DeviceInputs(cache.inputs[b], c.dtype));
    ASSERT_TRUE(contiguous.status.ok()) << flash::to_string(contiguous.status);
    // The paged call plans its splits for the cache's capacity, the contiguous one for this length:
    // the sums are taken in another order, so the two agree to the tolerance, not to the bit.
    const harness::ErrorStats err = harness::compare(o, contiguous.o);
    const double tolerance = harness::agreement_tolerance(c.dtype, c.dtype);
    EXPECT_TRUE(err.within(tolerance)) << "paged O vs contiguous: " << err.describe() << " (allowed " << tolerance
                                       << ")";
    EXPECT_TRUE(harness::compare(lse, contiguous.lse).within(kHalfLseTolerance))
        << "paged lse vs contiguous: " << harness::compare(lse, contiguous.lse).describe();
    expect_matches_reference(p, cache.inputs[b], o, lse, harness::sample_rows(p.rows(), p.rows()));
  }
}

INSTANTIATE_TEST_SUITE_P(Paged, PagedDecode, ::testing::ValuesIn(paged_cases()), paged_name);

// The paged path is deterministic too, and a length past the page table is clamped to it (no read
// past the table's row).
TEST_F(Stage13, stage13_PagedIsDeterministicAndClampsLengths) {
  const PagedCase c{32, 8, 1, 128, 64, false, DType::kBf16};
  HostPagedCache cache = build_paged(c, {20000, 3000});
  const Result first = run_paged(c, cache);
  const Result second = run_paged(c, cache);
  ASSERT_TRUE(first.status.ok() && second.status.ok());
  EXPECT_EQ(0, std::memcmp(first.o.data(), second.o.data(), first.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * sizeof(float)));
  // Sequence 1 claims more keys than its row of the table holds: only the table's pages are read
  // (its spare column holds 1 << 30, which no page has: those keys count as zeros).
  cache.cache_lens[1] = 1 << 30;
  const Result clamped = run_paged(c, cache);
  ASSERT_TRUE(clamped.status.ok()) << flash::to_string(clamped.status);
}

}  // namespace

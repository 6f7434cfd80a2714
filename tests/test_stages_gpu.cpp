// Every stage against the fp64 reference and against the stage before it, over a sweep of shapes
// that includes sequence lengths that are not tile multiples, seq_q != seq_kv, MHA, GQA and MQA,
// in every dtype the stage has (the decoding stage, 13, on the shapes of the sweep with at most 16
// query rows; its own sweep of decode shapes and its paged cache are in test_decoding_gpu.cpp).
// The sweeps come in two tiers (stage_params::full_sweep): by default shapes chosen to reach each
// stage's code paths (default_sweep says which and why), with FLASH_TEST_SWEEP=full the exhaustive
// sweep. Half-precision stages are held to FlashAttention's own rule
// (reference::check_half_precision) and compared with the stage before them on the same rounded
// inputs, across the dtype change from stage 07 (fp32) to stage 08.
// Outputs are poisoned with NaN before each run, so an element a kernel forgets to write fails.
// Without a GPU every test here skips with the reason.
// The exercises (exercises/README.md) run through the same tests as their stages. As shipped they
// fail, each failure naming the exercise and its file, until the learner's lines are right.
// The stages that choose their tiles from the GPU's shared memory per block (04-07) run the sweep
// again under the limits of a T4, an RTX 30/40 card and the 48 KiB default, whatever the GPU
// (flash::set_shared_memory_limit), wherever a limit changes their tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>

#include "reference.h"
#include "registry.h"
#include "stage_params.h"

namespace {

using stage_params::exercise_prefix;
using stage_params::see_todo;
using stage_params::stage_label;
using stage_params::stages_and_exercises;
using stage_params::stages_where;

// Problems below are written {batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, causal}.

constexpr uint64_t kSeed = 7;
// fp32 sums of up to a few thousand terms: a correct stage sits near 1e-7 relative, well under this.
constexpr double kFp32Tolerance = 1e-5;
// With extreme inputs the scores are in the hundreds and fp32 rounds each one by up to
// |s| * 2^-24 (about 1e-5 absolute); exp turns that into a relative error of the same size in P.
constexpr double kExtremeTolerance = 1e-4;
// lse of a half stage: the scores are exact products of the rounded inputs summed in fp32, so only
// fp32 accumulation and ex2.approx's relative error (about 2^-22) remain, ten times fp32's bound.
constexpr double kHalfLseTolerance = 1e-4;

// Host multiply-adds the fp64 reference may spend per case (rows * seq_kv * head_dim * 2); past this
// it checks a spread sample of rows and the previous stage covers every element.
constexpr double kReferenceMacs = 1 << 26;

struct Case {
  int stage_number;
  harness::Problem problem;
  bool exercise = false;  // the exercise of stage stage_number rather than the stage
  int smem_limit_kib = 0;  // not 0: run with flash::set_shared_memory_limit(this many KiB)
};

// How GoogleTest prints a case in a failure message.
void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.exercise ? "exercise " : "stage ") << c.stage_number << ", " << c.problem.describe();
  if (c.smem_limit_kib != 0) *os << ", shared memory per block limited to " << c.smem_limit_kib << " KiB";
}

const registry::Stage& stage_of(const Case& c) {
  return c.exercise ? *registry::find_exercise(c.stage_number) : *registry::find(c.stage_number);
}

// The case of stage (or exercise) s on problem p.
Case case_of(const registry::Stage& s, const harness::Problem& p) { return {s.number, p, s.is_exercise()}; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const harness::Problem& p = info.param.problem;
  std::ostringstream s;
  s << stage_of(info.param).label() << "_d" << p.head_dim << "_b"
    << p.batch << "h" << p.heads_q << "kv" << p.heads_kv << "_q" << p.seq_q << "_k" << p.seq_kv
    << (p.causal ? "_causal" : "") << (p.dtype != flash::DType::kFp32 ? std::string("_") + flash::dtype_name(p.dtype) : "");
  if (info.param.smem_limit_kib != 0) s << "_smem" << info.param.smem_limit_kib << "k";
  return s.str();
}

// The exhaustive sweep (FLASH_TEST_SWEEP=full): every length below against itself and the uneven
// pairs, four head layouts, every head_dim, causal and not, every dtype.
std::vector<Case> full_sweep() {
  const int lengths[] = {1, 2, 17, 63, 64, 65, 127, 128, 129, 1000, 1024, 2049};
  std::vector<std::pair<int, int>> seqs;
  for (int n : lengths) seqs.push_back({n, n});
  const std::pair<int, int> uneven[] = {{1, 2049}, {2049, 1}, {17, 1000}, {1000, 17}, {63, 129},
                                        {129, 63}, {64, 65},  {128, 2},   {2, 128},    {1024, 127}};
  seqs.insert(seqs.end(), std::begin(uneven), std::end(uneven));
  const int heads[][3] = {{1, 1, 1}, {2, 3, 3}, {2, 8, 2}, {4, 8, 1}};  // batch, heads_q, heads_kv

  std::vector<Case> cases;
  for (const registry::Stage* entry : stages_and_exercises())
    for (flash::DType dtype : entry->dtypes)
      for (int head_dim : {32, 64, 128})
        for (const auto& h : heads)
          for (const auto& [seq_q, seq_kv] : seqs)
            for (bool causal : {false, true}) {
              harness::Problem p{h[0], h[1], h[2], seq_q, seq_kv, head_dim, causal};
              p.dtype = dtype;
              if (entry->supports(p)) cases.push_back(case_of(*entry, p));
            }
  return cases;
}

// The default sweep: each shape below in every head_dim, dtype and mask of each stage (those it
// supports), every case one of the full sweep's. The tiles they meet, rows x keys per block:
//   {1,1,1, 1, 1}        one row, one key: a single partial tile everywhere, a softmax over one score.
//   {2,3,3, 128, 128}    MHA, 3 heads: lengths a multiple of every tile (16 to 128), so only the causal
//                        diagonal is masked.
//   {2,8,2, 129, 63}     GQA 4: both last tiles partial (129 = 128 + 1, 63 < 64); seq_q > seq_kv, so
//                        under the mask rows 0-65 see no key and get O = 0, lse = -inf, while the rest
//                        of their tile does see keys.
//   {4,8,1, 17, 1000}    MQA, 8 heads on one K/V head: one partial query tile against 1000 keys, many
//                        key tiles and a partial last one (1000 = 15 * 64 + 40 = 7 * 128 + 104); the
//                        causal diagonal in the last tiles, every tile before it unmasked.
//   {1,1,1, 1, 2049}     one query row against 33 key tiles of 64, the last one key (also stage 13's).
//   {1,1,1, 2049, 1}     17 query tiles of 128 and one key: causal, every row but the last sees no key,
//                        whole blocks skip every key tile.
//   {2,8,2, 1000, 1000}  many tiles both ways, the last ones partial; the causal diagonal through every
//                        query tile.
//   {1,1,1, 63, 129}     seq_q < seq_kv by 66: the causal diagonal off the tile grid, rows that see
//                        two or three key tiles of 64, the last one key.
// Per stage, what these reach:
//   01, 02  one block of 256 threads per score row: fewer keys than threads (1, 63, 128), more, and
//           not a multiple (1000, 2049); the S workspace of every shape.
//   03      one thread per query row, blocks of 128 rows: row counts that are not a multiple of 128
//           (2 * 8 * 129, 4 * 8 * 17, 2049) beside ones that are.
//   04-06   32 (04) or 64 (05, 06) query rows per block, key tiles sized from shared memory: partial
//           tiles on both sides, and again under each learner's limit (SharedMemoryLimits below),
//           where the tiles shrink. 06: tiles above the diagonal skipped, diagonal tiles masked, rows
//           that see no key.
//   07      the forward as 06; the backward below (backward_sweep).
//   08, 09  64 x 64 tiles on the tensor cores in both dtypes; 09's pipeline with one key tile
//           (its prologue only: 1, 63) and many (1000, 2049).
//   10      128 x 64 tiles, causal tiles longest first: the diagonal through many tiles (1000 x 1000)
//           and off the grid (63 x 129), query tiles with no key (2049 x 1).
//   12      head_dim 64 without the mask: the in-order kernel, 64 x 128 tiles; otherwise the persistent
//           ping-pong kernel, 128-row tiles of two consumers: partial and empty tiles as above. Its
//           schedules (more work tiles than SMs, pairs of query tiles and the tail) and 160-key tiles
//           need shapes of their own, in test_hopper_gpu.cpp.
//   13      the shapes with at most 16 query rows (1 x 1, 1 x 2049: up to 9 splits, merged); its decode
//           sweep is in test_decoding_gpu.cpp.
std::vector<Case> default_sweep() {
  // batch, heads_q, heads_kv, seq_q, seq_kv; head_dim, causal and dtype are set below
  const harness::Problem shapes[] = {{1, 1, 1, 1, 1},     {2, 3, 3, 128, 128},   {2, 8, 2, 129, 63},
                                     {4, 8, 1, 17, 1000}, {1, 1, 1, 1, 2049},    {1, 1, 1, 2049, 1},
                                     {2, 8, 2, 1000, 1000}, {1, 1, 1, 63, 129}};
  std::vector<Case> cases;
  for (const registry::Stage* entry : stages_and_exercises()) {
    for (flash::DType dtype : entry->dtypes)
      for (int head_dim : {32, 64, 128})
        for (harness::Problem p : shapes)
          for (bool causal : {false, true}) {
            p.head_dim = head_dim;
            p.causal = causal;
            p.dtype = dtype;
            if (entry->supports(p)) cases.push_back(case_of(*entry, p));
          }
  }
  return cases;
}

std::vector<Case> sweep() { return stage_params::full_sweep() ? full_sweep() : default_sweep(); }

// Skips, with the reason, where there is no GPU. An exercise's skip says that nothing judged the
// learner's lines: "exercise 05: not checked: no GPU (...)", the reason skip_summary prints.
void require_gpu(const registry::Stage* s = nullptr) {
  std::string why;
  if (harness::gpu_available(&why)) return;
  if (s != nullptr && s->is_exercise()) GTEST_SKIP() << exercise_prefix(*s) << "not checked: no GPU (" << why << ")";
  GTEST_SKIP() << why;
}

// Skips, with the reason, a stage this GPU is too old for (the tensor-core stages need 8.0), or one
// that runs on one architecture only (stage 12: Hopper, and only in a build with its sm_90a code).
void require_compute_capability(const registry::Stage& s) {
  if (s.min_compute_capability == 0 && !s.check_gpu) return;
  const flash::Status status = s.check_gpu ? s.check_gpu() : flash::check_compute_capability(s.min_compute_capability);
  if (status.code == flash::StatusCode::kArchNotSupported)
    GTEST_SKIP() << s.label() << ": " << flash::to_string(status);
}

// For an exercise, every failure of a test ends with a trace naming the exercise and its file.
class ExerciseTrace {
 protected:
  void trace(const registry::Stage& s) {
    if (s.is_exercise())
      trace_ = std::make_unique<::testing::ScopedTrace>(
          __FILE__, __LINE__, exercise_prefix(s) + "fill in the TODO(exercise) lines of " + s.exercise_file);
  }

 private:
  std::unique_ptr<::testing::ScopedTrace> trace_;
};

class StageSweep : public ::testing::TestWithParam<Case>, protected ExerciseTrace {
 protected:
  void SetUp() override {
    require_gpu(&stage_of(GetParam()));
    if (IsSkipped()) return;
    require_compute_capability(stage_of(GetParam()));
    trace(stage_of(GetParam()));
    if (GetParam().smem_limit_kib != 0)
      flash::set_shared_memory_limit(static_cast<size_t>(GetParam().smem_limit_kib) * 1024);
  }
  void TearDown() override { flash::set_shared_memory_limit(0); }
};

// O and lse at the picked rows against the fp64 reference: relative L2 for fp32 (or fp32_tolerance),
// FlashAttention's max-error rule for a half dtype. Messages of an exercise name it and its file.
void expect_matches_reference(const registry::Stage& stage, const harness::Problem& p,
                              const harness::HostInputs& host, const registry::ForwardResult& got,
                              const std::vector<long long>& rows, double fp32_tolerance) {
  const std::string who = exercise_prefix(stage), see = see_todo(stage);
  const std::vector<float> got_o = harness::gather_rows(got.o, rows, p.head_dim);
  const std::vector<float> got_lse = harness::gather_rows(got.lse, rows, 1);
  if (p.dtype == flash::DType::kFp32) {
    const reference::ForwardRows ref = reference::forward_rows(p, host, rows);
    const harness::ErrorStats o_err = harness::compare(got_o, ref.o);
    EXPECT_TRUE(o_err.within(fp32_tolerance)) << who << "O vs reference: " << o_err.describe() << see;
    const harness::ErrorStats lse_err = harness::compare(got_lse, ref.lse);
    EXPECT_TRUE(lse_err.within(kFp32Tolerance)) << who << "lse vs reference: " << lse_err.describe() << see;
    return;
  }
  const reference::HalfPrecisionCheck check = reference::check_half_precision(p, host, rows, got_o);
  EXPECT_TRUE(check.passes()) << "O vs reference: " << check.error.describe() << ", allowed max_abs " << check.bound
                              << " (twice the " << check.baseline_max_abs << " of attention computed in "
                              << flash::dtype_name(p.dtype) << ", plus " << reference::kHalfErrorSlack << ")";
  const harness::ErrorStats lse_err = harness::compare(got_lse, check.exact.lse);
  EXPECT_TRUE(lse_err.within(kHalfLseTolerance)) << "lse vs reference: " << lse_err.describe();
}

TEST_P(StageSweep, MatchesReferenceAndPreviousStage) {
  const registry::Stage& stage = stage_of(GetParam());
  const harness::Problem& p = GetParam().problem;
  const harness::HostInputs host = harness::make_inputs(p, kSeed);

  const registry::ForwardResult got = registry::run_forward(stage, p, host);
  ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
  EXPECT_EQ(harness::count_nonfinite(got.o), 0u)
      << exercise_prefix(stage) << "unwritten or non-finite output" << see_todo(stage);

  const long long max_rows = std::max(64LL, static_cast<long long>(kReferenceMacs / (2.0 * p.seq_kv * p.head_dim)));
  expect_matches_reference(stage, p, host, got, harness::sample_rows(p.rows(), max_rows), kFp32Tolerance);

  if (const registry::Stage* prev = registry::previous(stage, p)) {
    const registry::ForwardResult before = registry::run_forward(*prev, p, host);
    ASSERT_TRUE(before.status.ok()) << flash::to_string(before.status);
    const harness::ErrorStats prev_err = harness::compare(got.o, before.o);
    const double tolerance = harness::agreement_tolerance(p.dtype, prev->in_own_dtype(p).dtype);
    EXPECT_TRUE(prev_err.within(tolerance)) << exercise_prefix(stage) << "O vs stage " << prev->number << " in "
                                            << flash::dtype_name(prev->in_own_dtype(p).dtype) << ": "
                                            << prev_err.describe() << " (allowed " << tolerance << ")"
                                            << see_todo(stage);
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, StageSweep, ::testing::ValuesIn(sweep()), case_name);

// Extreme inputs: scaled scores reach several hundred, past expf's overflow near 88.7.
harness::Problem extreme_problem() { return {2, 3, 3, 129, 1000, 64, false}; }

// "stage08_bf16" (fp32 stages: "stage05", exercises "exercise05"): a case named by its stage and dtype only.
std::string stage_dtype_name(const ::testing::TestParamInfo<Case>& info) {
  const flash::DType dtype = info.param.problem.dtype;
  return stage_of(info.param).label() +
         (dtype == flash::DType::kFp32 ? "" : std::string("_") + flash::dtype_name(dtype));
}

// One case per stage (and exercise) and dtype, for the tests that are not a sweep of shapes.
std::vector<Case> every_dtype(bool (*keep)(const registry::Stage&), harness::Problem p) {
  std::vector<Case> cases;
  for (const registry::Stage* s : stages_and_exercises())
    if (keep(*s))
      for (flash::DType dtype : s->dtypes) {
        p.dtype = dtype;
        cases.push_back(case_of(*s, p));
      }
  return cases;
}

// The lesson of stage 01, asserted: exp(s) overflows to inf, inf / inf is NaN.
TEST(stage01_naive, ExtremeScoresOverflowToNaN) {
  require_gpu();
  if (IsSkipped()) return;  // GTEST_SKIP in a helper returns from the helper only
  const harness::Problem p = extreme_problem();
  const harness::DeviceInputs dev(harness::make_inputs(p, kSeed, harness::InputKind::kExtreme));
  const registry::ForwardResult got = registry::run_forward(*registry::find(1), p, dev);
  ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
  EXPECT_GT(harness::count_nonfinite(got.o), 0u) << "stage 01 was expected to overflow on extreme scores";
}

class ExtremeInputs : public StageSweep {};

TEST_P(ExtremeInputs, StayFiniteAndCorrect) {
  const harness::Problem& p = GetParam().problem;
  const harness::HostInputs host = harness::make_inputs(p, kSeed, harness::InputKind::kExtreme);
  const registry::Stage& stage = stage_of(GetParam());
  const registry::ForwardResult got = registry::run_forward(stage, p, host);
  ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
  EXPECT_EQ(harness::count_nonfinite(got.o), 0u)
      << exercise_prefix(stage) << "non-finite output on extreme scores" << see_todo(stage);
  expect_matches_reference(stage, p, host, got, harness::sample_rows(p.rows(), p.rows()), kExtremeTolerance);
}

// The tests below run prefill shapes (hundreds of query rows); a decoding stage (max_seq_q set) takes
// at most 16 and has the same tests on decode shapes in test_decoding_gpu.cpp.
bool prefill(const registry::Stage& s) { return s.max_seq_q == 0; }

// Every stage after 01, whose overflow is the point of its own test above, in each of its dtypes.
INSTANTIATE_TEST_SUITE_P(Stages, ExtremeInputs,
                         ::testing::ValuesIn(every_dtype([](const registry::Stage& s) {
                           return s.number > 1 && prefill(s);
                         }, extreme_problem())),
                         case_name);

// Parameterized by a stage and one of its dtypes (the problem's other fields are the test's own).
class EveryStage : public StageSweep {
 protected:
  const registry::Stage& stage() const { return stage_of(GetParam()); }
  // sizes in the case's dtype
  harness::Problem problem(harness::Problem sizes) const {
    sizes.dtype = GetParam().problem.dtype;
    return sizes;
  }
};

// The same inputs twice give the same bits: no atomics, no order that depends on scheduling.
TEST_P(EveryStage, IsDeterministic) {
  const harness::Problem p = problem({2, 8, 2, 1000, 1024, 64, stage().causal});
  const harness::DeviceInputs dev(harness::make_inputs(p, kSeed), p.dtype);
  const registry::ForwardResult first = registry::run_forward(stage(), p, dev);
  const registry::ForwardResult second = registry::run_forward(stage(), p, dev);
  ASSERT_TRUE(first.status.ok() && second.status.ok());
  EXPECT_EQ(0, std::memcmp(first.o.data(), second.o.data(), first.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * sizeof(float)));
}

// One long sequence, one head: 32768 keys per row, 16 times the longest of the sweep.
TEST_P(EveryStage, LongSequenceMatchesPreviousStage) {
  const harness::Problem p = problem({1, 1, 1, 32768, 32768, 64, false});
  const registry::Stage* prev = registry::previous(stage(), p);
  ASSERT_NE(prev, nullptr);
  const harness::HostInputs host = harness::make_inputs(p, kSeed);
  const registry::ForwardResult got = registry::run_forward(stage(), p, host);
  const registry::ForwardResult before = registry::run_forward(*prev, p, host);
  ASSERT_TRUE(got.status.ok() && before.status.ok());
  const harness::ErrorStats err = harness::compare(got.o, before.o);
  EXPECT_TRUE(err.within(harness::agreement_tolerance(p.dtype, prev->in_own_dtype(p).dtype)))
      << "vs stage " << prev->number << ": " << err.describe();
  const double lse_tolerance = p.dtype == flash::DType::kFp32 ? kFp32Tolerance : kHalfLseTolerance;
  EXPECT_TRUE(harness::compare(got.lse, before.lse).within(lse_tolerance));
}

// The scale is any finite number: negative (the softmax then favours the smallest scores, and a
// kernel that takes the max before scaling, or scales masked -inf, goes wrong), zero (every visible
// key weighs the same; -inf times 0 would be NaN) and large. Both head dims, since a stage may
// choose different code per head_dim.
TEST_P(EveryStage, AnyScaleMatchesReference) {
  for (int head_dim : {64, 128})
    for (float scale : {-0.2f, 0.0f, 1.5f}) {
      harness::Problem p = problem({2, 4, 2, 129, 200, head_dim, stage().causal});
      p.scale = scale;
      const harness::HostInputs host = harness::make_inputs(p, kSeed);
      const registry::ForwardResult got = registry::run_forward(stage(), p, host);
      ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
      SCOPED_TRACE("head_dim " + std::to_string(head_dim) + ", scale " + std::to_string(scale));
      expect_matches_reference(stage(), p, host, got, harness::sample_rows(p.rows(), p.rows()), kFp32Tolerance);
    }
}

// O(N) memory: at seq 131072 the score matrix alone is 64 GiB. Stages that materialize it refuse to
// be run there by the runner and the benchmark; the fused ones run and agree with the reference.
TEST_P(EveryStage, LongestSequenceRunsInLinearMemory) {
  const harness::Problem p = problem({1, 1, 1, 131072, 131072, 64, false});
  const size_t workspace = stage().workspace_bytes(p);
  if (workspace > 0) {
    EXPECT_EQ(workspace, static_cast<size_t>(p.seq_q) * p.seq_kv * sizeof(float));
    return;
  }
  const harness::HostInputs host = harness::make_inputs(p, kSeed);
  const registry::ForwardResult got = registry::run_forward(stage(), p, host);
  ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
  expect_matches_reference(stage(), p, host, got, harness::sample_rows(p.rows(), 64), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Stages, EveryStage,
                         ::testing::ValuesIn(every_dtype([](const registry::Stage& s) {
                           return s.number > 1 && prefill(s);  // stage 01 has no stage before it
                         }, harness::Problem{})),
                         stage_dtype_name);

// Causal independence: a row's output depends only on the keys it may see. Replacing K and V at
// every key from `cut` on must leave each row that stops before `cut` bit for bit unchanged, and
// must change the rows that see past it. The cut falls where the diagonal meets the middle query
// row, so both kinds of rows exist.
class CausalStage : public EveryStage {};

TEST_P(CausalStage, HiddenKeysDoNotAffectOutput) {
  for (const auto& [seq_q, seq_kv] : {std::pair{200, 200}, {100, 300}, {300, 100}, {129, 1000}, {1000, 129}}) {
    const harness::Problem p = problem({2, 4, 2, seq_q, seq_kv, 64, true});
    const int cut = std::clamp(seq_kv - seq_q + seq_q / 2, 1, seq_kv - 1);
    harness::HostInputs host = harness::make_inputs(p, kSeed);
    const registry::ForwardResult before = registry::run_forward(stage(), p, host);
    const harness::HostInputs other = harness::make_inputs(p, kSeed + 1);
    for (long long e = 0; e < p.kv_elems(); ++e)
      if ((e / p.head_dim) % seq_kv >= cut) {
        host.k[e] = other.k[e];
        host.v[e] = other.v[e];
      }
    const registry::ForwardResult after = registry::run_forward(stage(), p, host);
    ASSERT_TRUE(before.status.ok() && after.status.ok());

    long long unchanged_rows = 0, changed_rows = 0;
    for (long long row = 0; row < p.rows(); ++row) {
      const int query = static_cast<int>(row % seq_q);
      const bool sees_past_cut = flash::causal_key_end(query, seq_q, seq_kv) > cut;
      const bool same = std::memcmp(&before.o[row * p.head_dim], &after.o[row * p.head_dim],
                                    p.head_dim * sizeof(float)) == 0 &&
                        std::memcmp(&before.lse[row], &after.lse[row], sizeof(float)) == 0;
      if (!sees_past_cut) {
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

INSTANTIATE_TEST_SUITE_P(Stages, CausalStage,
                         ::testing::ValuesIn(every_dtype([](const registry::Stage& s) { return s.causal && prefill(s); },
                                                         harness::Problem{})),
                         stage_dtype_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CausalStage);

// Extreme inputs with the causal mask: rows that see few keys have the sharpest softmax.
harness::Problem causal_extreme_problem() {
  harness::Problem p = extreme_problem();
  p.causal = true;
  return p;
}
INSTANTIATE_TEST_SUITE_P(Causal, ExtremeInputs,
                         ::testing::ValuesIn(every_dtype([](const registry::Stage& s) { return s.causal && prefill(s); },
                                                         causal_extreme_problem())),
                         case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CausalExtreme);

// ---------------------------------------------------------------------------------------------
// Backward (stages with a backward entry point)
// ---------------------------------------------------------------------------------------------

// dQ, dK, dV sum seq_kv (or seq_q) products of fp32 recomputed probabilities; measured worst cases sit
// far below this, which leaves room for longer sums.
constexpr double kBackwardTolerance = 1e-4;

// The exhaustive backward sweep (FLASH_TEST_SWEEP=full).
std::vector<Case> full_backward_sweep() {
  // The fp64 reference backward is O(N^2 d) on the host; long sequences run with one head only.
  const std::pair<int, int> seqs[] = {{1, 1},   {2, 2},    {17, 17},  {63, 63},   {64, 64},   {65, 65},
                                      {127, 128}, {129, 129}, {1, 129}, {129, 1},  {17, 100}, {100, 17},
                                      {256, 256}};
  const int heads[][3] = {{1, 1, 1}, {2, 3, 3}, {2, 8, 2}, {4, 8, 1}};
  std::vector<Case> cases;
  for (const registry::Stage* entry : stages_and_exercises()) {
    const registry::Stage& stage = *entry;
    if (!stage.backward) continue;
    for (flash::DType dtype : stage.dtypes)
      for (int head_dim : {32, 64, 128})
        for (bool causal : {false, true}) {
          auto add = [&](harness::Problem p) {
            p.dtype = dtype;
            if (stage.supports(p)) cases.push_back(case_of(stage, p));
          };
          for (const auto& h : heads)
            for (const auto& [seq_q, seq_kv] : seqs) add({h[0], h[1], h[2], seq_q, seq_kv, head_dim, causal});
          for (const auto& [seq_q, seq_kv] : {std::pair{1000, 1000}, {1024, 1000}, {1000, 2049}})
            add({1, 1, 1, seq_q, seq_kv, head_dim, causal});
        }
  }
  return cases;
}

// The default backward sweep: each shape below in every head_dim, dtype and mask of each stage with
// a backward, every shape one of the full sweep's.
//   {1,1,1, 1, 1}        one row, one key: P = 1, so dQ = dK = 0 exactly.
//   {2,3,3, 127, 128}    MHA: keys exactly one 128-key block (two 64-key tiles), query rows one short
//                        of a multiple of every step: a partial last step.
//   {2,8,2, 129, 129}    GQA 4: dK, dV summed over 4 query heads; a last key tile and query step of one.
//   {4,8,1, 17, 100}     MQA: dK, dV summed over 8 heads; seq_q < seq_kv, so keys 0-83 are seen by
//                        every row and the rest by a few (the causal start of each key block).
//   {4,8,1, 100, 17}     seq_q > seq_kv: under the mask rows 0-82 see no key (dQ = 0 there; the
//                        first 64-row step skipped by the key block).
//   {1,1,1, 256, 256}    several key blocks and query steps, exact multiples: blocks wholly above,
//                        on and below the causal diagonal.
// Per stage, what these reach:
//   07      64 x 64 tiles of keys and query rows in fp32, smaller under each learner's shared-memory
//           limit (SharedMemoryLimits below runs these shapes again there).
//   11      dK, dV in blocks of 128 keys stepping over 64 query rows (128 at head_dim 64 where shared
//           memory allows; Stage11NarrowStep runs 64 there too), dQ by atomics through shared memory
//           (Stage11RedAdd: by red.global.add) in the default mode, and by the deterministic pass's
//           64 x 64 tiles; both modes in both dtypes.
std::vector<Case> default_backward_sweep() {
  // batch, heads_q, heads_kv, seq_q, seq_kv; head_dim, causal and dtype are set below
  const harness::Problem shapes[] = {{1, 1, 1, 1, 1},    {2, 3, 3, 127, 128}, {2, 8, 2, 129, 129},
                                     {4, 8, 1, 17, 100}, {4, 8, 1, 100, 17},  {1, 1, 1, 256, 256}};
  std::vector<Case> cases;
  for (const registry::Stage* entry : stages_and_exercises()) {
    if (!entry->backward) continue;
    for (flash::DType dtype : entry->dtypes)
      for (int head_dim : {32, 64, 128})
        for (harness::Problem p : shapes)
          for (bool causal : {false, true}) {
            p.head_dim = head_dim;
            p.causal = causal;
            p.dtype = dtype;
            if (entry->supports(p)) cases.push_back(case_of(*entry, p));
          }
  }
  return cases;
}

std::vector<Case> backward_sweep() {
  return stage_params::full_sweep() ? full_backward_sweep() : default_backward_sweep();
}

class BackwardSweep : public StageSweep {};

// A half-precision backward (stage 11) by FlashAttention's rule, per gradient: its max error against
// the fp64 gradients at most twice that of the same backward computed with PyTorch's roundings in the
// same dtype (reference::backward_in_dtype), plus what D = rowsum(dO o O) from the O stored in the
// dtype costs by design (reference::backward_with_stored_o), plus reference::kHalfGradientSlack. The
// deterministic mode is held to the same rule; where the stage sums with atomics, the default mode is too.
void expect_half_gradients_match_reference(const registry::Stage& stage, const harness::Problem& p,
                                           const reference::Gradients& exact, const reference::Gradients& baseline,
                                           const reference::Gradients& stored_o,
                                           const registry::BackwardResult& got, const char* mode) {
  for (const auto& [name, x, r, b, so] : {std::tuple{"dq", &got.dq, &exact.dq, &baseline.dq, &stored_o.dq},
                                          {"dk", &got.dk, &exact.dk, &baseline.dk, &stored_o.dk},
                                          {"dv", &got.dv, &exact.dv, &baseline.dv, &stored_o.dv}}) {
    const reference::HalfGradientCheck check = reference::check_half_gradient(*x, *r, *b, *so);
    EXPECT_TRUE(check.passes()) << stage.label() << " (" << mode << ") " << name << " vs reference: "
                                << check.error.describe() << ", allowed max_abs " << check.bound << " (twice the "
                                << check.baseline_max_abs << " of the backward computed in "
                                << flash::dtype_name(p.dtype) << ", plus " << check.stored_o_max_abs
                                << " from D of the stored O, plus " << reference::kHalfGradientSlack << ")";
    char max_abs[32];
    std::snprintf(max_abs, sizeof max_abs, "%.3e/%.3e", check.error.max_abs, check.bound);
    ::testing::Test::RecordProperty(std::string(name) + "_" + mode + "_max_abs_of_bound", max_abs);
  }
}

TEST_P(BackwardSweep, MatchesReferenceGradients) {
  const registry::Stage& stage = stage_of(GetParam());
  const harness::Problem& p = GetParam().problem;
  const harness::HostInputs host = harness::make_inputs(p, kSeed);
  const harness::DeviceInputs dev(host, p.dtype);
  if (p.dtype != flash::DType::kFp32) {
    const reference::Gradients exact = reference::backward(p, host);
    const reference::Gradients baseline = reference::backward_in_dtype(p, host);
    const reference::Gradients stored_o = reference::backward_with_stored_o(p, host);
    for (bool deterministic : {false, true}) {
      if (!deterministic && !stage.backward_atomic) continue;  // one mode only: it is the same kernel
      const registry::BackwardResult got = registry::run_backward(stage, p, dev, 0.0f, deterministic);
      ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
      expect_half_gradients_match_reference(stage, p, exact, baseline, stored_o, got,
                                            deterministic ? "deterministic" : "default");
    }
    return;
  }
  const registry::BackwardResult got = registry::run_backward(stage, p, dev);
  ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
  const reference::Gradients ref = reference::backward(p, host);
  for (const auto& [name, x, r] : {std::tuple{"dq", &got.dq, &ref.dq}, {"dk", &got.dk, &ref.dk}, {"dv", &got.dv, &ref.dv}}) {
    const harness::ErrorStats err = harness::compare(*x, *r);
    // Where the exact gradient is zero (one key: P = 1, so dS = dP - D = 0 and dQ = dK = 0) only
    // fp32 rounding of dP - D is left, and there is no norm to be relative to: judge it absolutely.
    const bool exactly_zero = std::all_of(r->begin(), r->end(), [](double e) { return e == 0.0; });
    EXPECT_TRUE(exactly_zero ? err.nonfinite == 0 && err.max_abs < kBackwardTolerance : err.within(kBackwardTolerance))
        << exercise_prefix(stage) << name << " vs reference: " << err.describe() << see_todo(stage);
    char rel_l2[32];  // scientific: the errors are around 1e-6, below std::to_string's six decimals
    std::snprintf(rel_l2, sizeof rel_l2, "%.3e", err.rel_l2);
    RecordProperty(std::string(name) + "_rel_l2", rel_l2);
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, BackwardSweep, ::testing::ValuesIn(backward_sweep()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackwardSweep);

// ---------------------------------------------------------------------------------------------
// The GPUs learners have: less shared memory per block than this GPU, by flash::set_shared_memory_limit
// ---------------------------------------------------------------------------------------------

// Shared memory per block, in KiB, where a learner's GPU allows less than an H100 (227 KiB): an
// RTX 30/40 card 99 (sm_86, sm_89), a T4 64 (sm_75), and 48, what any block gets without opting in.
constexpr int kLearnerLimitsKib[] = {99, 64, 48};

// Whether `tiles` (a stage's forward_tiles or backward_tiles; null: tiles that never change) picks
// other tiles at head_dim under limit_kib than with no limit, or none.
bool limit_changes_tiles(registry::TilesFn tiles, int head_dim, int limit_kib) {
  if (!tiles) return false;
  flash::TileShape own, limited;
  const flash::Status a = tiles(head_dim, SIZE_MAX, &own);
  const flash::Status b = tiles(head_dim, static_cast<size_t>(limit_kib) * 1024, &limited);
  return !a.ok() || !b.ok() || own.block_rows != limited.block_rows || own.block_cols != limited.block_cols;
}

// The cases of a sweep again under each of kLearnerLimitsKib, where the limit changes the stage's
// tiles (elsewhere the case is the sweep's own): on an H100 this runs what a T4 or an RTX 30/40 card
// runs. The backward's cases count its own tiles as well as the forward's. Stages only: the tile
// choice is no part of an exercise.
std::vector<Case> under_learner_limits(const std::vector<Case>& cases, bool backward) {
  std::vector<Case> limited;
  for (int kib : kLearnerLimitsKib)
    for (Case c : cases) {
      const registry::Stage& s = stage_of(c);
      const int d = c.problem.head_dim;
      if (s.is_exercise() || !(limit_changes_tiles(s.forward_tiles, d, kib) ||
                               (backward && limit_changes_tiles(s.backward_tiles, d, kib))))
        continue;
      c.smem_limit_kib = kib;
      limited.push_back(c);
    }
  return limited;
}

INSTANTIATE_TEST_SUITE_P(SharedMemoryLimits, StageSweep, ::testing::ValuesIn(under_learner_limits(sweep(), false)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(SharedMemoryLimits, BackwardSweep,
                         ::testing::ValuesIn(under_learner_limits(backward_sweep(), true)), case_name);

// Stage 11 picks its step by the limit too, outside the registry's tiles (its block keeps 128 keys):
// 128 query rows per step at head_dim 64 where a block may use 162 KiB, 64 rows below
// (stage11::backward_step_rows). Its head_dim 64 cases again under an RTX 30/40 card's 99 KiB, so that
// this GPU runs the 64-row step as well.
std::vector<Case> stage11_under_rtx_limit(const std::vector<Case>& cases) {
  constexpr int kRtxLimitKib = 99;
  std::vector<Case> limited;
  for (Case c : cases)
    if (!c.exercise && c.stage_number == 11 && c.problem.head_dim == 64) {
      c.smem_limit_kib = kRtxLimitKib;
      limited.push_back(c);
    }
  return limited;
}

INSTANTIATE_TEST_SUITE_P(Stage11NarrowStep, BackwardSweep,
                         ::testing::ValuesIn(stage11_under_rtx_limit(backward_sweep())), case_name);

// And the way stage 11 adds dQ's shares: through shared memory and one bulk copy per warp on this GPU
// (stage11::backward_bulk_dq), by red.global.add from registers where a block has no room for the
// staging, as under an A100's 163 KiB at head_dim 64 and 128. Its bf16 cases at those head_dims again
// under that limit, so that this GPU runs the red.global.add path too (the path does not depend on the
// dtype; head_dim 32's block fits its staging under 163 KiB).
std::vector<Case> stage11_under_a100_limit(const std::vector<Case>& cases) {
  constexpr int kA100LimitKib = 163;
  std::vector<Case> limited;
  for (Case c : cases)
    if (!c.exercise && c.stage_number == 11 && c.problem.head_dim != 32 && c.problem.dtype == flash::DType::kBf16) {
      c.smem_limit_kib = kA100LimitKib;
      limited.push_back(c);
    }
  return limited;
}

INSTANTIATE_TEST_SUITE_P(Stage11RedAdd, BackwardSweep,
                         ::testing::ValuesIn(stage11_under_a100_limit(backward_sweep())), case_name);

class StageSharedMemory : public ::testing::TestWithParam<registry::Stage> {
 protected:
  void SetUp() override {
    require_gpu();
    if (IsSkipped()) return;
    require_compute_capability(GetParam());
  }
  void TearDown() override { flash::set_shared_memory_limit(0); }
};

// Under each learner's limit, flash::shared_memory_limit reports it (or this GPU's own limit, where
// lower), and the stage picks tiles within it: smaller ones than this GPU's wherever its own do not fit.
TEST_P(StageSharedMemory, EachLimitSelectsTilesThatFit) {
  const registry::Stage& s = GetParam();
  size_t own_limit = 0;
  ASSERT_TRUE(flash::shared_memory_limit(&own_limit).ok());
  int smaller = 0;
  for (int kib : kLearnerLimitsKib) {
    const size_t bytes = static_cast<size_t>(kib) * 1024;
    flash::set_shared_memory_limit(bytes);
    EXPECT_EQ(flash::shared_memory_limit_override(), bytes);
    size_t limit = 0;
    ASSERT_TRUE(flash::shared_memory_limit(&limit).ok());
    EXPECT_EQ(limit, std::min(bytes, own_limit)) << kib << " KiB";
    for (const auto& [tiles, pass] : {std::pair{s.forward_tiles, "forward"}, {s.backward_tiles, "backward"}}) {
      if (!tiles) continue;
      for (int d : s.head_dims) {
        SCOPED_TRACE(std::string(pass) + " at head_dim " + std::to_string(d) + " under " + std::to_string(kib) +
                     " KiB");
        flash::TileShape own, limited;
        ASSERT_TRUE(tiles(d, own_limit, &own).ok());
        const flash::Status status = tiles(d, limit, &limited);
        ASSERT_TRUE(status.ok()) << flash::to_string(status);
        EXPECT_LE(limited.shared_bytes, limit);
        if (own.shared_bytes > limit) {
          EXPECT_LT(limited.shared_bytes, own.shared_bytes);
          EXPECT_LT(limited.block_cols, own.block_cols);
          ++smaller;
        } else {
          EXPECT_EQ(limited.block_cols, own.block_cols) << "tiles that fit are the GPU's own";
          EXPECT_EQ(limited.shared_bytes, own.shared_bytes);
        }
      }
    }
  }
  // Every stage with tiles has one that a 48 KiB block cannot hold, except where this GPU's own
  // limit already took the smallest (a T4: the backward).
  if (own_limit >= 99 * 1024) {
    EXPECT_GT(smaller, 0) << "no limit changed the tiles of " << s.label();
  }
  flash::set_shared_memory_limit(0);
  EXPECT_EQ(flash::shared_memory_limit_override(), 0u);
  size_t restored = 0;
  ASSERT_TRUE(flash::shared_memory_limit(&restored).ok());
  EXPECT_EQ(restored, own_limit);
}

INSTANTIATE_TEST_SUITE_P(Stages, StageSharedMemory,
                         ::testing::ValuesIn(stages_where([](const registry::Stage& s) {
                           return !s.is_exercise() && s.forward_tiles != nullptr;
                         })),
                         stage_label);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StageSharedMemory);

// Below what a stage's smallest tiles need (1 KiB per block here), the call is refused before any
// launch with a status that names shared memory and the GPU. Stages 01-03 keep no tiles in shared
// memory (01 and 02 reduce through a 1 KiB buffer): they run under any limit.
class StageBelowSmallestTiles : public StageSharedMemory {};

TEST_P(StageBelowSmallestTiles, IsRefusedNamingSharedMemoryAndTheGpu) {
  const registry::Stage& s = GetParam();
  constexpr size_t kTinyLimit = 1024;
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  const bool has_tiles = s.number >= 4;
  for (int d : s.head_dims) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    const int seq_q = s.max_seq_q != 0 ? std::min(70, s.max_seq_q) : 70;  // a decoding stage takes up to 16
    const harness::Problem p{1, 2, 1, seq_q, 90, d, false, 0.0f, s.dtypes.front()};
    const harness::DeviceInputs dev(harness::make_inputs(p, kSeed), p.dtype);
    flash::set_shared_memory_limit(kTinyLimit);
    const registry::ForwardResult got = registry::run_forward(s, p, dev);
    flash::set_shared_memory_limit(0);
    if (!has_tiles) {
      EXPECT_TRUE(got.status.ok()) << flash::to_string(got.status);
      continue;
    }
    const std::string message = flash::to_string(got.status);
    ASSERT_EQ(got.status.code, flash::StatusCode::kSharedMemoryTooSmall) << message;
    EXPECT_EQ(got.status.value, static_cast<long long>(kTinyLimit));
    EXPECT_GT(got.status.required, static_cast<long long>(kTinyLimit));
    if (s.forward_tiles) {  // the bytes needed are those of the smallest tiles
      flash::TileShape smallest;
      ASSERT_TRUE(s.forward_tiles(d, flash::kDefaultSharedMemory, &smallest).ok());
      EXPECT_EQ(got.status.required, static_cast<long long>(smallest.shared_bytes));
    }
    for (const std::string& part : {std::string("shared memory"), std::string(prop.name),
                                    std::string("flash::set_shared_memory_limit")})
      EXPECT_NE(message.find(part), std::string::npos) << "'" << message << "' should name " << part;

    if (!s.backward) continue;
    // The backward on its own (the forward above was refused): checked before any launch as well, in
    // both modes.
    harness::DeviceTensor o(p.dtype, static_cast<size_t>(p.q_elems())), dq(p.dtype, static_cast<size_t>(p.q_elems())),
        dk(p.dtype, static_cast<size_t>(p.kv_elems())), dv(p.dtype, static_cast<size_t>(p.kv_elems()));
    harness::DeviceBuffer<float> lse(p.rows());
    harness::DeviceBuffer<unsigned char> workspace(s.backward_workspace_bytes(p));
    for (bool deterministic : {false, true}) {
      flash::set_shared_memory_limit(kTinyLimit);
      const flash::Status back =
          s.backward(dev.q.get(), dev.k.get(), dev.v.get(), o.get(), lse.get(), dev.d_out.get(), dq.get(), dk.get(),
                     dv.get(), p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim, p.softmax_scale(), false,
                     p.dtype, deterministic, workspace.get(), workspace.bytes(), nullptr);
      flash::set_shared_memory_limit(0);
      ASSERT_EQ(back.code, flash::StatusCode::kSharedMemoryTooSmall) << flash::to_string(back);
      EXPECT_GT(back.required, static_cast<long long>(kTinyLimit));
      if (s.backward_tiles) {  // the bytes needed are those of the smallest tiles
        flash::TileShape smallest;
        ASSERT_TRUE(s.backward_tiles(d, flash::kDefaultSharedMemory, &smallest).ok());
        EXPECT_EQ(back.required, static_cast<long long>(smallest.shared_bytes));
      }
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, StageBelowSmallestTiles,
                         ::testing::ValuesIn(stages_where([](const registry::Stage& s) { return !s.is_exercise(); })),
                         stage_label);

class StageBackward : public ::testing::TestWithParam<registry::Stage>, protected ExerciseTrace {
 protected:
  void SetUp() override {
    require_gpu(&GetParam());
    if (IsSkipped()) return;
    require_compute_capability(GetParam());
    trace(GetParam());
  }
  // sizes in the stage's first dtype
  harness::Problem problem(harness::Problem sizes) const {
    sizes.dtype = GetParam().dtypes.front();
    return sizes;
  }
};

harness::Problem tiny_problem(bool causal) { return {1, 2, 1, 5, 7, 32, causal}; }

// The GPU gradients against central differences of the GPU forward itself: f = sum(O * dO).
// In fp32 the difference quotient carries about eps * |f| / h of rounding, so the step is large
// (1e-2) and the check loose (2e-3 relative); it catches wrong formulas, not last bits. In a half
// dtype O is rounded to 2^-9 (bf16) relative: a difference quotient of it would be noise, so the
// half stages are held to the fp64 reference by BackwardSweep instead.
// Instantiated for the fp32 stages alone, so that no GPU run reports a skip for the half ones.
class Fp32StageBackward : public StageBackward {};

TEST_P(Fp32StageBackward, GradientMatchesFiniteDifferencesOfForward) {
  constexpr float kStep = 1e-2f;
  constexpr double kTolerance = 2e-3;
  for (bool causal : {false, true}) {
    const harness::Problem p = tiny_problem(causal);
    const harness::HostInputs host = harness::make_inputs(p, kSeed);
    const registry::BackwardResult grad = registry::run_backward(GetParam(), p, harness::DeviceInputs(host));
    ASSERT_TRUE(grad.status.ok()) << flash::to_string(grad.status);
    auto loss = [&](const harness::HostInputs& x) {
      const registry::ForwardResult r = registry::run_forward(GetParam(), p, harness::DeviceInputs(x));
      double f = 0;
      for (size_t e = 0; e < r.o.size(); ++e) f += static_cast<double>(r.o[e]) * x.d_out[e];
      return f;
    };
    for (const auto& [tensor, g, name] : {std::tuple{&harness::HostInputs::q, &grad.dq, "dq"},
                                          {&harness::HostInputs::k, &grad.dk, "dk"},
                                          {&harness::HostInputs::v, &grad.dv, "dv"}}) {
      for (size_t e = 0; e < g->size(); ++e) {
        harness::HostInputs plus = host, minus = host;
        (plus.*tensor)[e] += kStep;
        (minus.*tensor)[e] -= kStep;
        const double fd = (loss(plus) - loss(minus)) / (static_cast<double>((plus.*tensor)[e]) - (minus.*tensor)[e]);
        EXPECT_NEAR((*g)[e], fd, kTolerance * (1.0 + std::abs(fd))) << name << "[" << e << "] causal=" << causal;
      }
    }
  }
}

// The backward recomputes P from lse. Feeding it a wrong lse (off by log 2, i.e. P doubled) must
// change the gradients: proof that lse is read and used.
TEST_P(StageBackward, WrongLseChangesGradients) {
  harness::Problem p = problem(tiny_problem(false));
  p.seq_q = p.seq_kv = 100;
  p.head_dim = GetParam().head_dims.front();
  const harness::DeviceInputs dev(harness::make_inputs(p, kSeed), p.dtype);
  const registry::BackwardResult right = registry::run_backward(GetParam(), p, dev);
  const registry::BackwardResult wrong = registry::run_backward(GetParam(), p, dev, -std::log(2.0f));
  ASSERT_TRUE(right.status.ok() && wrong.status.ok());
  EXPECT_FALSE(harness::compare(wrong.dv, right.dv).within(0.1)) << harness::compare(wrong.dv, right.dv).describe();
  EXPECT_FALSE(harness::compare(wrong.dk, right.dk).within(0.1)) << harness::compare(wrong.dk, right.dk).describe();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// deterministic = true: the same inputs twice give the same bits, in every dtype of the stage, for
// a GQA problem (dK, dV summed over the group) with odd lengths, with and without the causal mask (a
// stage may order its blocks differently in each). A stage without atomics (07) is deterministic
// whatever the flag, so it is run both ways.
TEST_P(StageBackward, IsDeterministic) {
  for (flash::DType dtype : GetParam().dtypes)
    for (bool causal : {true, false})
      for (bool deterministic : {true, false}) {
        if (!deterministic && GetParam().backward_atomic) continue;  // the next test is about that mode
        harness::Problem p{2, 8, 2, 1000, 1024, 64, causal};
        p.dtype = dtype;
        SCOPED_TRACE(std::string(flash::dtype_name(dtype)) + (causal ? ", causal" : "") +
                     (deterministic ? ", deterministic" : ", default mode"));
        const harness::DeviceInputs dev(harness::make_inputs(p, kSeed), p.dtype);
        const registry::BackwardResult a = registry::run_backward(GetParam(), p, dev, 0.0f, deterministic);
        const registry::BackwardResult b = registry::run_backward(GetParam(), p, dev, 0.0f, deterministic);
        ASSERT_TRUE(a.status.ok() && b.status.ok());
        EXPECT_TRUE(same_bits(a.dq, b.dq));
        EXPECT_TRUE(same_bits(a.dk, b.dk));
        EXPECT_TRUE(same_bits(a.dv, b.dv));
      }
}

// The default mode of a stage that sums dQ with atomics: dK and dV have one writer each and are bit
// for bit those of the deterministic mode (the same kernel computes them in the same order); dQ is
// the same sum in another order, so two runs, and the deterministic run, agree to fp32 summation
// order before the final rounding: at most one unit in the last place of the dtype per element
// (an fp32 sum a rounding boundary apart), far inside agreement_tolerance.
// Instantiated for the stages that sum with atomics alone (IsDeterministic covers the others).
class AtomicStageBackward : public StageBackward {};

TEST_P(AtomicStageBackward, AtomicModeAgreesWithDeterministicMode) {
  for (flash::DType dtype : GetParam().dtypes)
    for (bool causal : {false, true}) {
      harness::Problem p{2, 8, 2, 1000, 1024, 64, causal};
      p.dtype = dtype;
      SCOPED_TRACE(std::string(flash::dtype_name(dtype)) + (causal ? ", causal" : ""));
      const harness::DeviceInputs dev(harness::make_inputs(p, kSeed), p.dtype);
      const registry::BackwardResult fixed = registry::run_backward(GetParam(), p, dev, 0.0f, true);
      const registry::BackwardResult first = registry::run_backward(GetParam(), p, dev, 0.0f, false);
      const registry::BackwardResult second = registry::run_backward(GetParam(), p, dev, 0.0f, false);
      ASSERT_TRUE(fixed.status.ok() && first.status.ok() && second.status.ok());
      EXPECT_TRUE(same_bits(first.dk, fixed.dk));
      EXPECT_TRUE(same_bits(first.dv, fixed.dv));
      EXPECT_TRUE(same_bits(second.dk, fixed.dk) && same_bits(second.dv, fixed.dv));
      const double tolerance = harness::agreement_tolerance(p.dtype, p.dtype) / 10;
      for (const auto* run : {&first, &second}) {
        const harness::ErrorStats err = harness::compare(run->dq, fixed.dq);
        EXPECT_TRUE(err.within(tolerance)) << "dQ, default vs deterministic mode: " << err.describe() << " (allowed "
                                           << tolerance << ")";
      }
    }
}

// O(N) memory: seq 65536, one head. The score matrix would be 16 GiB; the backward's workspace is at
// most a few floats per query row (D, the lse in base 2, a counter per tile), plus head_dim floats per
// row where dQ is summed with atomics.
TEST_P(StageBackward, LongSequenceRunsInLinearMemory) {
  const harness::Problem p = problem({1, 1, 1, 65536, 65536, 64, false});
  const size_t per_row = (GetParam().backward_atomic ? 3 + p.head_dim : 1) * sizeof(float);
  EXPECT_LE(GetParam().backward_workspace_bytes(p), p.seq_q * per_row);
  for (bool deterministic : {false, true}) {
    const registry::BackwardResult got = registry::run_backward(
        GetParam(), p, harness::DeviceInputs(harness::make_inputs(p, kSeed), p.dtype), 0.0f, deterministic);
    ASSERT_TRUE(got.status.ok()) << flash::to_string(got.status);
    EXPECT_EQ(harness::count_nonfinite(got.dq) + harness::count_nonfinite(got.dk) + harness::count_nonfinite(got.dv),
              0u);
    if (!GetParam().backward_atomic) break;  // one mode
  }
}

// ---------------------------------------------------------------------------------------------
// Exercises: one line each at the end of the run
// ---------------------------------------------------------------------------------------------

// After the run, one line per exercise that had tests in it: how many failed and where to look, or
// that all passed, or that none ran (no GPU, or a GPU too old for the stage). These are the last
// lines of `ctest -L exercise05 --output-on-failure`; ctest's entry for an exercise stops at its first
// failure (--gtest_fail_fast) and takes "exercise NN: not checked" as its skip (tests/CMakeLists.txt).
class ExerciseSummary : public ::testing::EmptyTestEventListener {
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    struct Count {
      int failed = 0, passed = 0, skipped = 0;
    };
    std::map<int, Count> by_exercise;
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
      for (int j = 0; j < suite.total_test_count(); ++j) {
        const ::testing::TestInfo& test = *suite.GetTestInfo(j);
        const std::string name = test.name();
        const size_t at = name.find("exercise");
        if (!test.should_run() || at == std::string::npos || at + 10 > name.size()) continue;
        Count& c = by_exercise[std::atoi(name.substr(at + 8, 2).c_str())];
        if (test.result()->Failed()) ++c.failed;
        else if (test.result()->Skipped()) ++c.skipped;
        else ++c.passed;
      }
    }
    for (const auto& [number, c] : by_exercise) {
      const registry::Stage* e = registry::find_exercise(number);
      if (!e) continue;
      const std::string who = exercise_prefix(*e);
      if (c.failed > 0)
        std::printf("%s%d test(s) failed%s: fill in the TODO(exercise) lines of %s (lesson: stages/%s/README.md)\n",
                    who.c_str(), c.failed, c.skipped > 0 ? " (the run stops at the first failure)" : "",
                    e->exercise_file, e->folder);
      else if (c.passed == 0)
        std::printf("%snot checked: %d test(s) skipped, none ran (the reason is above)\n", who.c_str(), c.skipped);
      else
        std::printf("%sall %d test(s) pass: your %s does what stage %02d does\n", who.c_str(), c.passed,
                    e->exercise_file, number);
    }
    std::fflush(stdout);
  }
};

// ctest's verdict on a stage's entry (tests/CMakeLists.txt): skipped only when some tests skipped
// and none failed. Matching GoogleTest's own "[  SKIPPED ]" lines instead would report a run with a
// failure and a skip as skipped, hiding the failure.
class SkipVerdict : public ::testing::EmptyTestEventListener {
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    if (unit.failed_test_count() == 0 && unit.skipped_test_count() > 0)
      std::printf("flash-stages: %d test(s) skipped, none failed\n", unit.skipped_test_count());
    std::fflush(stdout);
  }
};

const bool kListenersAdded = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new ExerciseSummary);
  ::testing::UnitTest::GetInstance()->listeners().Append(new SkipVerdict);
  return true;
}();

INSTANTIATE_TEST_SUITE_P(Stages, StageBackward,
                         ::testing::ValuesIn(stages_where([](const registry::Stage& s) { return s.backward != nullptr; })),
                         stage_label);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StageBackward);
INSTANTIATE_TEST_SUITE_P(Stages, Fp32StageBackward, ::testing::ValuesIn(stages_where([](const registry::Stage& s) {
                           return s.backward != nullptr && s.dtypes.front() == flash::DType::kFp32;
                         })),
                         stage_label);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Fp32StageBackward);
INSTANTIATE_TEST_SUITE_P(Stages, AtomicStageBackward,
                         ::testing::ValuesIn(stages_where([](const registry::Stage& s) { return s.backward_atomic; })),
                         stage_label);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(AtomicStageBackward);

}  // namespace

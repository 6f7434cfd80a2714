// Every stage checks its arguments before any launch, so these run on the host with fake (never
// dereferenced) device pointers: a bad call must come back with the right status and a message
// naming the argument, and must not touch the GPU. The exercises (exercises/README.md) keep their
// stages' launchers, so they are held to the same checks; below, their entries and files are too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>

#include "11_backward_tc/backward_tc.h"
#include "13_decoding/decoding.h"
#include "registry.h"
#include "stage_params.h"

namespace {

using stage_params::stage_label;
using stage_params::stages_where;

// Well-formed arguments for a problem the stage supports; each test breaks one thing.
struct Call {
  // Fake addresses on a 256-byte boundary; a valid call would fail only when a kernel launches.
  const float* q = reinterpret_cast<const float*>(std::uintptr_t{0x10000});
  const float* k = reinterpret_cast<const float*>(std::uintptr_t{0x20000});
  const float* v = reinterpret_cast<const float*>(std::uintptr_t{0x30000});
  float* o = reinterpret_cast<float*>(std::uintptr_t{0x40000});
  float* lse = reinterpret_cast<float*>(std::uintptr_t{0x50000});
  int batch = 2, heads_q = 4, heads_kv = 2, seq_q = 33, seq_kv = 65, head_dim = 64;
  float scale = 0.125f;
  bool causal = false;
  flash::DType dtype;
  void* workspace = reinterpret_cast<void*>(std::uintptr_t{0x60000});
  size_t workspace_bytes = 0;

  explicit Call(const registry::Stage& s) : dtype(s.dtypes.front()) {
    if (s.max_seq_q != 0) seq_q = std::min(seq_q, s.max_seq_q);  // a decoding stage: as many rows as it takes
    workspace_bytes = s.forward_workspace_size(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim);
  }
  flash::Status run(const registry::Stage& s) const {
    return s.forward(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, dtype,
                     workspace, workspace_bytes, nullptr);
  }
};

// A well-formed backward call; each test breaks one thing.
struct BackwardCall : Call {
  const float* d_o = reinterpret_cast<const float*>(std::uintptr_t{0x70000});
  float* dq = reinterpret_cast<float*>(std::uintptr_t{0x80000});
  float* dk = reinterpret_cast<float*>(std::uintptr_t{0x90000});
  float* dv = reinterpret_cast<float*>(std::uintptr_t{0xA0000});
  size_t backward_workspace_bytes;
  bool deterministic = false;
  explicit BackwardCall(const registry::Stage& s)
      : Call(s), backward_workspace_bytes(s.backward_workspace_size(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)) {}
  flash::Status run(const registry::Stage& s) const {
    return s.backward(q, k, v, o, lse, d_o, dq, dk, dv, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                      causal, dtype, deterministic, workspace, backward_workspace_bytes, nullptr);
  }
};

class StageValidation : public ::testing::TestWithParam<registry::Stage> {
 protected:
  const registry::Stage& stage() const { return GetParam(); }
  // Runs the call (forward or backward), expects `code`, and checks that the message names `argument`.
  template <typename AnyCall>
  void expect(const AnyCall& call, flash::StatusCode code, const std::string& argument) {
    const cudaError_t pending_before = cudaPeekAtLastError();
    const flash::Status s = call.run(stage());
    EXPECT_EQ(s.code, code) << flash::to_string(s);
    const std::string message = flash::to_string(s);
    EXPECT_NE(message.find(argument), std::string::npos) << "message '" << message << "' should name " << argument;
    // No launch was attempted, so no new CUDA error is pending.
    EXPECT_EQ(cudaPeekAtLastError(), pending_before);
  }

};

TEST_P(StageValidation, NullPointersAreNamed) {
  for (auto field : {&Call::q, &Call::k, &Call::v}) {
    Call c(stage());
    c.*field = nullptr;
    expect(c, flash::StatusCode::kNullPointer, field == &Call::q ? "q" : field == &Call::k ? "k" : "v");
  }
  Call c(stage());
  c.o = nullptr;
  expect(c, flash::StatusCode::kNullPointer, "o");
}

TEST_P(StageValidation, ZeroAndNegativeSizesAreNamed) {
  for (int bad : {0, -3}) {
    for (auto [field, name] : {std::pair{&Call::batch, "batch"}, {&Call::heads_q, "heads_q"},
                               {&Call::heads_kv, "heads_kv"}, {&Call::seq_q, "seq_q"}, {&Call::seq_kv, "seq_kv"},
                               {&Call::head_dim, "head_dim"}}) {
      Call c(stage());
      c.*field = bad;
      expect(c, flash::StatusCode::kInvalidDimension, std::string(name) + " = " + std::to_string(bad));
    }
  }
}

TEST_P(StageValidation, SizesPastTheIndexRangeAreRefused) {
  Call c(stage());
  c.batch = 1 << 20;
  c.heads_q = 1 << 8;
  c.heads_kv = 1 << 8;
  expect(c, flash::StatusCode::kInvalidDimension, "batch*heads_q*seq_q");
}

TEST_P(StageValidation, UnsupportedHeadDim) {
  for (int d : {1, 16, 48, 96, 256}) {
    Call c(stage());
    c.head_dim = d;
    expect(c, flash::StatusCode::kHeadDimNotSupported, "head_dim = " + std::to_string(d));
  }
}

TEST_P(StageValidation, HeadsNotAMultiple) {
  Call c(stage());
  c.heads_q = 6;
  c.heads_kv = 4;
  expect(c, flash::StatusCode::kHeadsNotDivisible, "heads_q = 6, heads_kv = 4");
}

TEST_P(StageValidation, NonFiniteScale) {
  Call c(stage());
  c.scale = std::numeric_limits<float>::quiet_NaN();
  expect(c, flash::StatusCode::kInvalidArgument, "scale");
}

TEST_P(StageValidation, MisalignedPointersAreNamed) {
  Call c(stage());
  c.q += 1;  // 4 bytes past a 16-byte boundary
  expect(c, flash::StatusCode::kMisalignedPointer, "q");
  Call d(stage());
  d.lse += 2;
  expect(d, flash::StatusCode::kMisalignedPointer, "lse");
}

// Each dtype the stage lacks is refused by name, before any launch: fp16/bf16 for stages 01-07,
// fp32 for the tensor-core stages.
TEST_P(StageValidation, DtypeItLacksIsRefused) {
  int refused = 0;
  for (flash::DType dtype : {flash::DType::kFp32, flash::DType::kFp16, flash::DType::kBf16}) {
    if (stage().has_dtype(dtype)) continue;
    Call c(stage());
    c.dtype = dtype;
    expect(c, flash::StatusCode::kDtypeNotSupported, std::string("dtype = ") + flash::dtype_name(dtype));
    ++refused;
  }
  EXPECT_GT(refused, 0) << "every stage lacks at least one dtype";
}

using StageWithoutCausal = StageValidation;
TEST_P(StageWithoutCausal, CausalIsRefused) {
  Call c(stage());
  c.causal = true;
  expect(c, flash::StatusCode::kNotSupported, "causal");
}

using StageWithWorkspace = StageValidation;
TEST_P(StageWithWorkspace, WorkspaceTooSmallOrNull) {
  Call c(stage());
  const size_t needed = c.workspace_bytes;
  c.workspace_bytes = needed - 1;
  expect(c, flash::StatusCode::kWorkspaceTooSmall, "needs " + std::to_string(needed));
  Call d(stage());
  d.workspace = nullptr;
  expect(d, flash::StatusCode::kNullPointer, "workspace");
}

using StageWithBackward = StageValidation;
TEST_P(StageWithBackward, BackwardNamesNullAndMisalignedTensors) {
  for (auto [field, name] : {std::pair{&BackwardCall::dq, "dq"}, {&BackwardCall::dk, "dk"}, {&BackwardCall::dv, "dv"}}) {
    BackwardCall c(stage());
    c.*field = nullptr;
    expect(c, flash::StatusCode::kNullPointer, name);
    BackwardCall m(stage());
    m.*field += 1;
    expect(m, flash::StatusCode::kMisalignedPointer, name);
  }
  BackwardCall c(stage());
  c.d_o = nullptr;
  expect(c, flash::StatusCode::kNullPointer, "d_o");
  BackwardCall l(stage());
  l.lse = nullptr;  // optional for the forward, required by the backward
  expect(l, flash::StatusCode::kNullPointer, "lse");
}

TEST_P(StageWithBackward, BackwardChecksShapesAndWorkspace) {
  BackwardCall c(stage());
  c.seq_kv = 0;
  expect(c, flash::StatusCode::kInvalidDimension, "seq_kv = 0");
  BackwardCall h(stage());
  h.head_dim = 80;
  expect(h, flash::StatusCode::kHeadDimNotSupported, "head_dim = 80");
  BackwardCall w(stage());
  const size_t needed = w.backward_workspace_bytes;
  ASSERT_GT(needed, 0u);
  w.backward_workspace_bytes = needed - 1;
  expect(w, flash::StatusCode::kWorkspaceTooSmall, "needs " + std::to_string(needed));
}

// Each dtype the stage lacks is refused by the backward too, by name, before any launch; in either
// mode (the deterministic flag changes no check).
TEST_P(StageWithBackward, BackwardRefusesDtypeItLacks) {
  int refused = 0;
  for (flash::DType dtype : {flash::DType::kFp32, flash::DType::kFp16, flash::DType::kBf16}) {
    if (stage().has_dtype(dtype)) continue;
    for (bool deterministic : {false, true}) {
      BackwardCall c(stage());
      c.dtype = dtype;
      c.deterministic = deterministic;
      expect(c, flash::StatusCode::kDtypeNotSupported, std::string("dtype = ") + flash::dtype_name(dtype));
    }
    ++refused;
  }
  EXPECT_GT(refused, 0);
}

// The backward's workspace is O(N): at most one fp32 per query row for D plus, where dQ is summed
// with atomics, head_dim fp32 per row for its accumulator, whose rows may be rounded up to whole query
// tiles of at most kMaxTileRows per head (and 16 bytes of alignment).
TEST_P(StageWithBackward, BackwardWorkspaceIsLinear) {
  constexpr size_t kBatchHeads = 2 * 4, kMaxTileRows = 128;
  for (int seq : {1, 1000, 65536}) {
    const size_t rows = kBatchHeads * static_cast<size_t>(seq);
    // Rows rounded up to whole tiles per head; at most three numbers per row (D, the lse in base 2, a
    // counter) and, where dQ is summed with atomics, head_dim floats of its accumulator.
    const size_t padded_rows = rows + kBatchHeads * (kMaxTileRows - 1);
    const size_t accum_rows = stage().backward_atomic ? padded_rows : 0;
    const size_t bytes = stage().backward_workspace_size(2, 4, 2, seq, 3 * seq, 64);
    EXPECT_GE(bytes, rows * sizeof(float)) << "seq " << seq;
    EXPECT_LE(bytes, (3 * padded_rows + accum_rows * 64) * sizeof(float) + 16) << "seq " << seq;
  }
  EXPECT_EQ(stage().backward_workspace_size(0, 4, 2, 10, 10, 64), 0u);
}

// ---------------------------------------------------------------------------------------------
// Stage 11: the tensor-core backward, paired with stage 10's forward
// ---------------------------------------------------------------------------------------------

TEST(stage11_backward_tc, RegistryEntry) {
  const registry::Stage* s = registry::find(11);
  ASSERT_NE(s, nullptr);
  EXPECT_STREQ(s->folder, "11_backward_tc");
  EXPECT_EQ(s->dtypes, (std::vector<flash::DType>{flash::DType::kBf16, flash::DType::kFp16}));
  EXPECT_EQ(s->head_dims, (std::vector<int>{32, 64, 128}));
  EXPECT_TRUE(s->causal);
  EXPECT_EQ(s->forward, registry::find(10)->forward) << "stage 11's forward is stage 10's";
  const harness::Problem bf16{1, 2, 1, 100, 100, 64, true, std::numeric_limits<float>::quiet_NaN(),
                              flash::DType::kBf16};
  EXPECT_EQ(registry::previous(*s, bf16)->number, 10);
  EXPECT_EQ(registry::previous(*registry::find(10), bf16)->number, 9);
  EXPECT_NE(s->backward, nullptr);
  EXPECT_TRUE(s->backward_atomic);
  EXPECT_EQ(s->min_compute_capability, 80);
  EXPECT_FALSE(registry::find(7)->backward_atomic);
  // The workspace: D (rounded up to 16 bytes), then the fp32 dQ accumulator, seq_q rounded up to 128.
  EXPECT_EQ(s->backward_workspace_size(1, 1, 1, 3, 5, 64), 16u + 128u * 64u * sizeof(float));
  EXPECT_EQ(s->backward_workspace_size(2, 8, 2, 1000, 7, 128), 2u * 8u * (1000u + 1024u * 128u) * sizeof(float));
}

// What the lesson quotes: the shared memory of each kernel's block, per head_dim and mode.
TEST(stage11_backward_tc, SharedMemoryPerBlock) {
  // dk_dv_kernel, both modes: K, V (Bc = 128 keys), Q and dO double-buffered (Br rows, 64 unless
  // said), P and dS of the step (Br x Bc), lse2 and D double-buffered.
  auto key_tile = [](int d, int br = 64) {
    constexpr int bc = 128;
    return static_cast<size_t>(2 * bc * d * 2 + 2 * 2 * br * d * 2 + 2 * br * bc * 2 + 2 * 2 * br * 4);
  };
  auto query_tile = [](int d) { return static_cast<size_t>(2 * 64 * d * 2 + 2 * 2 * 64 * d * 2); };
  EXPECT_EQ(stage11::backward_shared_bytes(64, false), key_tile(64));    // 99,328 (97 KiB)
  EXPECT_EQ(stage11::backward_shared_bytes(128, false), key_tile(128));  // 164,864 (161 KiB)
  EXPECT_EQ(stage11::backward_shared_bytes(32, false), key_tile(32));
  EXPECT_EQ(stage11::backward_shared_bytes(64, true), std::max(key_tile(64), query_tile(64)));
  EXPECT_EQ(stage11::backward_shared_bytes(128, true), std::max(key_tile(128), query_tile(128)));
  EXPECT_EQ(stage11::backward_shared_bytes(48, false), 0u);
  // Both modes fit an A100's 163 KiB per block; an RTX 30/40 card (99 KiB) runs head_dim 32 and 64.
  for (int d : {32, 64, 128})
    for (bool deterministic : {false, true}) EXPECT_LE(stage11::backward_shared_bytes(d, deterministic), 163u * 1024);
  EXPECT_LE(stage11::backward_shared_bytes(64, false), 99u * 1024);
}

// 128 query rows per step at head_dim 64 where their shared memory fits (an A100's 163 KiB, an H100's
// 227), 64 on an RTX 30/40 card (99 KiB) and at the other head_dims.
TEST(stage11_backward_tc, StepRowsPerGpu) {
  // dk_dv_kernel at d64 with 128 rows, as SharedMemoryPerBlock counts it: 165,888 bytes (162 KiB).
  constexpr size_t kWideBytes = 2 * 128 * 64 * 2 + 2 * 2 * 128 * 64 * 2 + 2 * 128 * 128 * 2 + 2 * 2 * 128 * 4;
  for (size_t kib : {227u, 163u}) EXPECT_EQ(stage11::backward_step_rows(64, kib * 1024), 128) << kib << " KiB";
  EXPECT_EQ(stage11::backward_step_rows(64, kWideBytes), 128);
  EXPECT_EQ(stage11::backward_step_rows(64, kWideBytes - 1), 64);
  EXPECT_EQ(stage11::backward_step_rows(64, 99u * 1024), 64);
  for (int d : {32, 128}) EXPECT_EQ(stage11::backward_step_rows(d, SIZE_MAX), 64) << "head_dim " << d;
  EXPECT_EQ(stage11::backward_step_rows(48, SIZE_MAX), 0);
}

// dQ's shares go through shared memory and the copy engine on compute capability 9.0 on, where the
// K/V-tile kernel's block has room for one query tile of dQ in fp32 beside its tiles: every head_dim
// on an H100 (227 KiB), none at 128 or 64 under an A100's 163 KiB (there the step's tiles alone take
// 161 and 162 KiB), and head_dim 32 (65 KiB + 16) but not 64 (97 KiB + 32) under an RTX card's 99.
TEST(stage11_backward_tc, BulkDqPerGpu) {
  for (int d : {32, 64, 128}) {
    EXPECT_TRUE(stage11::backward_bulk_dq(d, 90, 227u * 1024)) << "head_dim " << d;
    EXPECT_FALSE(stage11::backward_bulk_dq(d, 80, SIZE_MAX)) << "head_dim " << d << ": no bulk reductions before sm_90";
    EXPECT_FALSE(stage11::backward_bulk_dq(d, 90, 48u * 1024)) << "head_dim " << d;
  }
  for (int d : {64, 128}) EXPECT_FALSE(stage11::backward_bulk_dq(d, 90, 163u * 1024)) << "head_dim " << d;
  EXPECT_TRUE(stage11::backward_bulk_dq(32, 90, 99u * 1024));
  EXPECT_FALSE(stage11::backward_bulk_dq(64, 90, 99u * 1024));
  // Exactly at the block's size: d128's 161 KiB of tiles and 64 x 128 x 4 bytes of dQ.
  const size_t d128_bytes = stage11::backward_shared_bytes(128, false) + 64 * 128 * sizeof(float);
  EXPECT_TRUE(stage11::backward_bulk_dq(128, 90, d128_bytes));
  EXPECT_FALSE(stage11::backward_bulk_dq(128, 90, d128_bytes - 1));
  EXPECT_FALSE(stage11::backward_bulk_dq(48, 90, SIZE_MAX));
}

// ---------------------------------------------------------------------------------------------
// Tiles per GPU: stages 04-07 take the largest of their tiles that fits the GPU's shared memory
// ---------------------------------------------------------------------------------------------

// Shared memory per block, in KiB: an H100, an A100, an RTX 30/40 card, a T4 (opt-in limits), and
// the 48 KiB any block gets.
constexpr int kGpuLimitsKib[] = {227, 163, 99, 64, 48};

// The keys per K/V tile (the backward: rows and keys per tile) a stage must choose at head_dim under
// each of kGpuLimitsKib; the lessons' shared-memory arithmetic, as numbers.
struct ExpectedTiles {
  int stage;
  bool backward;
  int head_dim;
  int block_cols[5];
};
constexpr ExpectedTiles kExpectedTiles[] = {
    {4, false, 32, {32, 32, 32, 32, 32}},  {4, false, 64, {32, 32, 32, 32, 32}},  {4, false, 128, {32, 32, 32, 32, 16}},
    {5, false, 32, {64, 64, 64, 64, 64}},  {5, false, 64, {64, 64, 64, 32, 32}},  {5, false, 128, {32, 32, 32, 16, 8}},
    {6, false, 32, {64, 64, 64, 64, 64}},  {6, false, 64, {64, 64, 64, 32, 32}},  {6, false, 128, {32, 32, 32, 16, 8}},
    {7, false, 32, {64, 64, 64, 64, 64}},  {7, false, 64, {64, 64, 64, 32, 32}},  {7, false, 128, {32, 32, 32, 16, 8}},
    {7, true, 32, {64, 64, 64, 32, 32}},   {7, true, 64, {64, 64, 32, 32, 32}},   {7, true, 128, {64, 32, 32, 16, 16}},
};

// Bytes of shared memory per block that the lessons quote: {stage, backward, head_dim, Bc, bytes}.
struct QuotedBytes {
  int stage;
  bool backward;
  int head_dim;
  int block_cols;
  size_t bytes;
};
constexpr QuotedBytes kQuotedBytes[] = {
    {4, false, 128, 32, 53888},  {4, false, 128, 16, 35392},   // 52.6 KiB, 34.6 KiB
    {5, false, 64, 64, 67584},   {5, false, 64, 32, 42496},    // 66 KiB, 41.5 KiB
    {5, false, 128, 32, 75264},  {5, false, 128, 16, 54528},   // 73.5 KiB, 53.25 KiB
    {5, false, 128, 8, 44160},                                  // 43.1 KiB
    {7, true, 64, 64, 104960},   {7, true, 128, 64, 170496},   // 102.5 KiB, 166.5 KiB
    {7, true, 64, 32, 44288},    {7, true, 128, 32, 77056},    // 43.25 KiB, 75.25 KiB
    {7, true, 128, 16, 36480},                                  // 35.6 KiB
};

class StageTiles : public ::testing::TestWithParam<registry::Stage> {};

// forward_tiles and backward_tiles are plain functions of the limit: checked here without a GPU.
TEST_P(StageTiles, LargestTilesThatFitEachGpu) {
  const registry::Stage& s = GetParam();
  int rows = 0;
  for (const ExpectedTiles& e : kExpectedTiles) {
    if (e.stage != s.number) continue;
    ++rows;
    const registry::TilesFn tiles = e.backward ? s.backward_tiles : s.forward_tiles;
    ASSERT_NE(tiles, nullptr);
    for (size_t i = 0; i < std::size(kGpuLimitsKib); ++i) {
      const size_t limit = static_cast<size_t>(kGpuLimitsKib[i]) * 1024;
      SCOPED_TRACE(std::string(e.backward ? "backward" : "forward") + " at head_dim " + std::to_string(e.head_dim) +
                   " under " + std::to_string(kGpuLimitsKib[i]) + " KiB");
      flash::TileShape t;
      const flash::Status status = tiles(e.head_dim, limit, &t);
      ASSERT_TRUE(status.ok()) << flash::to_string(status);
      EXPECT_EQ(t.block_cols, e.block_cols[i]);
      EXPECT_EQ(t.block_rows, e.backward ? e.block_cols[i] : s.number == 4 ? 32 : 64);
      EXPECT_LE(t.shared_bytes, limit);
      const int quoted = !e.backward && s.number >= 5 ? 5 : s.number;  // 06 and 07 keep stage 05's tiles
      for (const QuotedBytes& q : kQuotedBytes) {
        if (q.stage == quoted && q.backward == e.backward && q.head_dim == e.head_dim && q.block_cols == t.block_cols) {
          EXPECT_EQ(t.shared_bytes, q.bytes);
        }
      }
    }
    // With no limit, the lesson's own tiles: the H100's.
    flash::TileShape unlimited;
    ASSERT_TRUE(tiles(e.head_dim, SIZE_MAX, &unlimited).ok());
    EXPECT_EQ(unlimited.block_cols, e.block_cols[0]);
  }
  EXPECT_EQ(rows, s.backward ? 6 : 3) << "no expected tiles for " << s.label();
}

// Below the smallest tiles: kSharedMemoryTooSmall with the limit and the bytes needed.
TEST_P(StageTiles, BelowTheSmallestTilesIsRefused) {
  const registry::Stage& s = GetParam();
  for (registry::TilesFn tiles : {s.forward_tiles, s.backward_tiles}) {
    if (!tiles) continue;
    for (int d : s.head_dims) {
      flash::TileShape smallest, t;
      ASSERT_TRUE(tiles(d, flash::kDefaultSharedMemory, &smallest).ok());
      const flash::Status status = tiles(d, smallest.shared_bytes - 1, &t);
      EXPECT_EQ(status.code, flash::StatusCode::kSharedMemoryTooSmall) << flash::to_string(status);
      EXPECT_EQ(status.value, static_cast<long long>(smallest.shared_bytes - 1));
      EXPECT_EQ(status.required, static_cast<long long>(smallest.shared_bytes));
      const std::string message = flash::to_string(status);
      EXPECT_NE(message.find("shared memory too small"), std::string::npos) << message;
      EXPECT_NE(message.find(std::to_string(smallest.shared_bytes) + " bytes per block"), std::string::npos)
          << message;
      EXPECT_EQ(tiles(48, smallest.shared_bytes, &t).code, flash::StatusCode::kHeadDimNotSupported);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, StageTiles,
                         ::testing::ValuesIn(stages_where([](const registry::Stage& s) {
                           return s.forward_tiles != nullptr;
                         })),
                         stage_label);

// ---------------------------------------------------------------------------------------------
// Stage 13 (decoding): its own limits, its workspace, its split plan and its paged entry point
// ---------------------------------------------------------------------------------------------

// Runs a status-returning call, expects `code` and a message containing `text`, and no launch.
template <typename Fn>
void expect_refused(Fn call, flash::StatusCode code, const std::string& text) {
  const cudaError_t pending_before = cudaPeekAtLastError();
  const flash::Status s = call();
  EXPECT_EQ(s.code, code) << flash::to_string(s);
  EXPECT_NE(flash::to_string(s).find(text), std::string::npos)
      << "message '" << flash::to_string(s) << "' should contain '" << text << "'";
  EXPECT_EQ(cudaPeekAtLastError(), pending_before);
}

TEST(stage13_decoding, RegistryEntry) {
  const registry::Stage* s = registry::find(13);
  ASSERT_NE(s, nullptr);
  EXPECT_NE(std::string(s->name).find("decoding"), std::string::npos);
  EXPECT_EQ(s->max_seq_q, stage13::kMaxSeqQ);
  EXPECT_EQ(s->head_dims, (std::vector<int>{64, 128}));
  EXPECT_TRUE(s->causal);
  EXPECT_NE(s->forward_paged, nullptr);
  EXPECT_NE(s->forward_paged_workspace_size, nullptr);
  EXPECT_NE(registry::find(11), nullptr);
  EXPECT_NE(registry::find(12), nullptr);
  EXPECT_EQ(registry::stage_numbers(), "1 to 14");
  const float usual_scale = std::numeric_limits<float>::quiet_NaN();  // 1 / sqrt(head_dim)
  harness::Problem p{1, 32, 8, 16, 4096, 128, true, usual_scale, flash::DType::kBf16};
  EXPECT_TRUE(s->supports(p));
  p.seq_q = 17;
  EXPECT_FALSE(s->supports(p));
  EXPECT_EQ(registry::previous(*s, {1, 32, 8, 1, 4096, 128, false, usual_scale, flash::DType::kBf16})->number, 10);
}

// ---------------------------------------------------------------------------------------------
// Stage 12 (Hopper): one architecture, its own head_dims, and who it is compared with
// ---------------------------------------------------------------------------------------------

TEST(stage12_hopper, RegistryEntry) {
  const registry::Stage* s = registry::find(12);
  ASSERT_NE(s, nullptr);
  EXPECT_STREQ(s->folder, "12_hopper");
  EXPECT_EQ(s->head_dims, (std::vector<int>{64, 128}));
  EXPECT_EQ(s->dtypes, (std::vector<flash::DType>{flash::DType::kBf16, flash::DType::kFp16}));
  EXPECT_TRUE(s->causal);
  EXPECT_EQ(s->min_compute_capability, 90);
  EXPECT_EQ(s->max_compute_capability, 90);
  EXPECT_NE(s->check_gpu, nullptr);
  const float usual_scale = std::numeric_limits<float>::quiet_NaN();
  const harness::Problem prefill{2, 8, 2, 1000, 1024, 128, true, usual_scale, flash::DType::kBf16};
  EXPECT_TRUE(s->supports(prefill));
  // Stage 12 is checked against stage 10; stage 13 too, not against the Hopper-only stage 12, so that
  // it keeps a stage to agree with on every GPU it runs on.
  EXPECT_EQ(registry::previous(*s, prefill)->number, 10);
  EXPECT_EQ(registry::previous(*registry::find(13), {1, 32, 8, 1, 4096, 128, false, usual_scale,
                                                     flash::DType::kBf16})->number, 10);
  EXPECT_FALSE(registry::find(13)->runs_wherever(*s));
  EXPECT_TRUE(s->runs_wherever(*registry::find(10)));
}

TEST(stage12_hopper, RefusesHeadDim32ByName) {
  const registry::Stage& s = *registry::find(12);
  for (int d : {32, 48}) {
    Call c(s);
    c.head_dim = d;
    expect_refused([&] { return c.run(s); }, flash::StatusCode::kHeadDimNotSupported,
                   "head_dim = " + std::to_string(d) + " (supported: 64, 128)");
  }
}

// Without a GPU (CI), the check of the GPU reports what CUDA said, and never claims the GPU is fine.
TEST(stage12_hopper, GpuCheckNeverSucceedsWithoutHopper) {
  int device = 0, major = 0;
  const bool hopper = cudaGetDevice(&device) == cudaSuccess &&
                      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                      major == 9;
  cudaGetLastError();
  const flash::Status s = registry::find(12)->check_gpu();
  cudaGetLastError();
  if (!hopper) {
    EXPECT_FALSE(s.ok());
    if (s.code == flash::StatusCode::kArchNotSupported) {
      EXPECT_EQ(s.required, 90);
      EXPECT_NE(flash::to_string(s).find("has compute capability"), std::string::npos) << flash::to_string(s);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Stage 14 (the Hopper backward): stage 12's forward (stage 10's at head_dim 32), its own head_dims
// and workspace
// ---------------------------------------------------------------------------------------------

TEST(stage14_hopper_backward, RegistryEntry) {
  const registry::Stage* s = registry::find(14);
  ASSERT_NE(s, nullptr);
  EXPECT_STREQ(s->folder, "14_hopper_backward");
  EXPECT_EQ(s->head_dims, (std::vector<int>{32, 64, 128}));
  EXPECT_EQ(s->dtypes, (std::vector<flash::DType>{flash::DType::kBf16, flash::DType::kFp16}));
  EXPECT_TRUE(s->causal);
  EXPECT_NE(s->forward, nullptr);
  EXPECT_EQ(s->forward_workspace_size(1, 1, 1, 3, 5, 64), registry::find(12)->forward_workspace_size(1, 1, 1, 3, 5, 64));
  EXPECT_EQ(s->forward_workspace_size(1, 1, 1, 3, 5, 32), registry::find(10)->forward_workspace_size(1, 1, 1, 3, 5, 32));
  EXPECT_NE(s->backward, nullptr);
  EXPECT_TRUE(s->backward_atomic);
  EXPECT_EQ(s->min_compute_capability, 90);
  EXPECT_EQ(s->max_compute_capability, 90);
  EXPECT_NE(s->check_gpu, nullptr);
  // The workspace: per query row (seq_q rounded up to 128 per head) the base-2 lse, D and head_dim
  // floats of the dQ accumulator (64 at head_dim 32, whose tiles are head_dim 64's), then one counter
  // per 64 rows.
  EXPECT_EQ(s->backward_workspace_size(1, 1, 1, 3, 5, 64), 128u * (2u + 64u) * sizeof(float) + 2u * sizeof(int));
  EXPECT_EQ(s->backward_workspace_size(1, 1, 1, 3, 5, 32), 128u * (2u + 64u) * sizeof(float) + 2u * sizeof(int));
  EXPECT_EQ(s->backward_workspace_size(2, 8, 2, 1000, 7, 128),
            16u * 1024u * (2u + 128u) * sizeof(float) + 16u * 16u * sizeof(int));
}

TEST(stage14_hopper_backward, RefusesHeadDim48ByName) {
  const registry::Stage& s = *registry::find(14);
  for (int d : {16, 48, 96}) {
    BackwardCall c(s);
    c.head_dim = d;
    c.backward_workspace_bytes = s.backward_workspace_size(c.batch, c.heads_q, c.heads_kv, c.seq_q, c.seq_kv, d);
    expect_refused([&] { return c.run(s); }, flash::StatusCode::kHeadDimNotSupported,
                   "head_dim = " + std::to_string(d) + " (supported: 32, 64, 128)");
  }
}

// Without a Hopper GPU, the check of the GPU never claims the GPU is fine.
TEST(stage14_hopper_backward, GpuCheckNeverSucceedsWithoutHopper) {
  int device = 0, major = 0;
  const bool hopper = cudaGetDevice(&device) == cudaSuccess &&
                      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                      major == 9;
  cudaGetLastError();
  const flash::Status s = registry::find(14)->check_gpu();
  cudaGetLastError();
  if (!hopper) {
    EXPECT_FALSE(s.ok());
    if (s.code == flash::StatusCode::kArchNotSupported) {
      EXPECT_EQ(s.required, 90);
    }
  }
}

// Well-formed contiguous call of the decoding shape stage 13 is measured on; each test breaks one thing.
struct DecodeCall : Call {
  explicit DecodeCall(const registry::Stage& s) : Call(s) {
    batch = 1;
    heads_q = 32;
    heads_kv = 8;
    seq_q = 1;
    seq_kv = 131072;
    head_dim = 128;
    workspace_bytes = s.forward_workspace_size(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim);
  }
};

TEST(stage13_decoding, RefusesWhatItDoesNotTake) {
  const registry::Stage& s = *registry::find(13);
  DecodeCall rows(s);
  rows.seq_q = 17;
  rows.workspace_bytes = s.forward_workspace_size(1, 32, 8, 17, 131072, 128);
  expect_refused([&] { return rows.run(s); }, flash::StatusCode::kNotSupported, "seq_q = 17 (decoding takes 1 to 16");
  DecodeCall d32(s);
  d32.head_dim = 32;
  expect_refused([&] { return d32.run(s); }, flash::StatusCode::kHeadDimNotSupported,
                 "head_dim = 32 (supported: 64, 128)");
  DecodeCall d48(s);
  d48.head_dim = 48;
  expect_refused([&] { return d48.run(s); }, flash::StatusCode::kHeadDimNotSupported,
                 "head_dim = 48 (supported: 64, 128)");
}

// forward_with_splits takes 1 to max_splits splits; any other count is refused by name before a launch.
TEST(stage13_decoding, ForcedSplitCountIsChecked) {
  const registry::Stage& s = *registry::find(13);
  const DecodeCall c(s);
  const int most = stage13::max_splits(c.batch, c.heads_q, c.heads_kv, c.seq_q, c.seq_kv);
  for (int splits : {0, -1, most + 1})
    expect_refused(
        [&] {
          return stage13::forward_with_splits(splits, c.q, c.k, c.v, c.o, c.lse, c.batch, c.heads_q, c.heads_kv,
                                              c.seq_q, c.seq_kv, c.head_dim, c.scale, c.causal, c.dtype, c.workspace,
                                              c.workspace_bytes, nullptr);
        },
        flash::StatusCode::kInvalidArgument, "num_splits = " + std::to_string(splits));
}

// The workspace is exactly max_splits partial rows of head_dim + 1 floats, and it is checked.
TEST(stage13_decoding, WorkspaceIsMaxSplitsPartialRows) {
  // batch 1, 32 query heads on 8 K/V heads, one query, 131072 keys: 8 units of work, so
  // min(256, 131072 / 256, 1024 / 8) = 128 splits at most.
  EXPECT_EQ(stage13::max_splits(1, 32, 8, 1, 131072), 128);
  EXPECT_EQ(stage13::forward_workspace_size(1, 32, 8, 1, 131072, 128), 128u * 32 * 1 * 129 * sizeof(float));
  // 64 sequences of 4096 keys: 512 units, at most 2 splits.
  EXPECT_EQ(stage13::max_splits(64, 32, 8, 1, 4096), 2);
  // 256 sequences: 2048 units fill any GPU without splitting: no workspace at all.
  EXPECT_EQ(stage13::max_splits(256, 32, 8, 1, 4096), 1);
  EXPECT_EQ(stage13::forward_workspace_size(256, 32, 8, 1, 4096, 128), 0u);
  // Few keys: a split holds at least kMinSplitKeys of them.
  EXPECT_EQ(stage13::max_splits(1, 32, 8, 1, 255), 1);
  EXPECT_EQ(stage13::max_splits(1, 32, 8, 1, 257), 2);
  // Rows of a group past 16 take more row tiles: heads 32/8 with 16 queries is 64 rows, 4 tiles.
  EXPECT_EQ(stage13::row_tiles(32, 8, 16), 4);
  EXPECT_EQ(stage13::row_tiles(32, 8, 1), 1);
  EXPECT_EQ(stage13::row_tiles(32, 1, 16), 32);

  const registry::Stage& s = *registry::find(13);
  DecodeCall small(s);
  ASSERT_GT(small.workspace_bytes, 0u);
  const size_t needed = small.workspace_bytes;
  small.workspace_bytes = needed - 1;
  expect_refused([&] { return small.run(s); }, flash::StatusCode::kWorkspaceTooSmall,
                 "needs " + std::to_string(needed));
  DecodeCall null_ws(s);
  null_ws.workspace = nullptr;
  expect_refused([&] { return null_ws.run(s); }, flash::StatusCode::kNullPointer, "workspace");
}

// The split plan on an H100 (132 SMs; a wave is one block per SM), the numbers the lesson works
// through for its three target shapes.
TEST(stage13_decoding, SplitPlanForTheH100) {
  EXPECT_EQ(stage13::choose_splits(1, 32, 8, 1, 131072, 132), 16);  // 8 x 16 = 128 blocks: one wave
  EXPECT_EQ(stage13::choose_splits(8, 32, 8, 1, 32768, 132), 2);    // 128 blocks
  EXPECT_EQ(stage13::choose_splits(64, 32, 8, 1, 4096, 132), 1);    // 512 blocks without splitting
  EXPECT_EQ(stage13::choose_splits(1, 32, 8, 1, 1024, 132), 4);     // 1024 keys: 4 splits of 256
  EXPECT_EQ(stage13::choose_splits(1, 32, 8, 1, 1 << 20, 132), 33);  // two waves: 4 idle SMs cost more
  for (int seq_kv : {1, 7, 255, 4097, 65537, 1 << 20})
    for (int batch : {1, 3, 64, 256}) {
      const int splits = stage13::choose_splits(batch, 32, 8, 1, seq_kv, 132);
      EXPECT_GE(splits, 1);
      EXPECT_LE(splits, stage13::max_splits(batch, 32, 8, 1, seq_kv)) << batch << " x " << seq_kv;
    }
}

// A well-formed paged call: 4 sequences of up to 8 pages of 64 keys; each test breaks one thing.
struct PagedCall {
  const void* q = reinterpret_cast<const void*>(std::uintptr_t{0x10000});
  const void* k_pages = reinterpret_cast<const void*>(std::uintptr_t{0x20000});
  const void* v_pages = reinterpret_cast<const void*>(std::uintptr_t{0x30000});
  const int* page_table = reinterpret_cast<const int*>(std::uintptr_t{0x40000});
  const int* cache_lens = reinterpret_cast<const int*>(std::uintptr_t{0x50000});
  void* o = reinterpret_cast<void*>(std::uintptr_t{0x60000});
  float* lse = reinterpret_cast<float*>(std::uintptr_t{0x70000});
  int batch = 4, heads_q = 8, heads_kv = 2, seq_q = 3, head_dim = 128, page_size = 64, num_pages = 40,
      max_pages_per_seq = 8;
  float scale = 0.125f;
  flash::DType dtype = flash::DType::kBf16;
  void* workspace = reinterpret_cast<void*>(std::uintptr_t{0x80000});
  size_t workspace_bytes = 1 << 20;
  flash::Status run() const {
    return stage13::forward_paged(q, k_pages, v_pages, page_table, cache_lens, o, lse, batch, heads_q, heads_kv, seq_q,
                                  head_dim, page_size, num_pages, max_pages_per_seq, scale, false, dtype, workspace,
                                  workspace_bytes, nullptr);
  }
};

TEST(stage13_decoding, PagedRefusesBadArgumentsByName) {
  using flash::StatusCode;
  for (auto [field, name] : {std::pair{&PagedCall::q, "q"}, {&PagedCall::k_pages, "k_pages"},
                             {&PagedCall::v_pages, "v_pages"}}) {
    PagedCall c;
    c.*field = nullptr;
    expect_refused([&] { return c.run(); }, StatusCode::kNullPointer, std::string(name) + " is null");
  }
  PagedCall table;
  table.page_table = nullptr;
  expect_refused([&] { return table.run(); }, StatusCode::kNullPointer, "page_table is null");
  PagedCall lens;
  lens.cache_lens = nullptr;
  expect_refused([&] { return lens.run(); }, StatusCode::kNullPointer, "cache_lens is null");
  PagedCall out;
  out.o = nullptr;
  expect_refused([&] { return out.run(); }, StatusCode::kNullPointer, "o is null");
  for (auto [field, name] : {std::pair{&PagedCall::batch, "batch"}, {&PagedCall::seq_q, "seq_q"},
                             {&PagedCall::page_size, "page_size"}, {&PagedCall::num_pages, "num_pages"},
                             {&PagedCall::max_pages_per_seq, "max_pages_per_seq"}}) {
    PagedCall c;
    c.*field = 0;
    expect_refused([&] { return c.run(); }, StatusCode::kInvalidDimension, std::string(name) + " = 0");
  }
  for (int bad : {8, 24, 48, 100, 1 << 17}) {
    PagedCall c;
    c.page_size = bad;
    expect_refused([&] { return c.run(); }, StatusCode::kInvalidArgument,
                   "page_size = " + std::to_string(bad) + " (must be a power of two from 16 to 65536)");
  }
  PagedCall rows;
  rows.seq_q = 17;
  expect_refused([&] { return rows.run(); }, StatusCode::kNotSupported, "seq_q = 17");
  PagedCall d32;
  d32.head_dim = 32;
  expect_refused([&] { return d32.run(); }, StatusCode::kHeadDimNotSupported, "head_dim = 32 (supported: 64, 128)");
  PagedCall heads;
  heads.heads_kv = 3;
  expect_refused([&] { return heads.run(); }, StatusCode::kHeadsNotDivisible, "heads_q = 8, heads_kv = 3");
  PagedCall capacity;
  capacity.max_pages_per_seq = 1 << 20;
  capacity.page_size = 1 << 16;
  expect_refused([&] { return capacity.run(); }, StatusCode::kInvalidDimension, "max_pages_per_seq*page_size");
  PagedCall misaligned;
  misaligned.page_table += 1;
  expect_refused([&] { return misaligned.run(); }, StatusCode::kMisalignedPointer, "page_table");
  PagedCall fp32;
  fp32.dtype = flash::DType::kFp32;
  expect_refused([&] { return fp32.run(); }, StatusCode::kDtypeNotSupported, "dtype = fp32");
  PagedCall scale;
  scale.scale = std::numeric_limits<float>::infinity();
  expect_refused([&] { return scale.run(); }, StatusCode::kInvalidArgument, "scale");
}

// The paged workspace is the contiguous one for the cache's capacity, and it is checked.
TEST(stage13_decoding, PagedWorkspaceIsPlannedForTheCapacity) {
  PagedCall c;
  c.batch = 1;
  c.heads_q = 32;
  c.heads_kv = 8;
  c.seq_q = 1;
  c.page_size = 256;
  c.max_pages_per_seq = 512;  // 131072 keys
  const size_t needed = stage13::forward_paged_workspace_size(1, 32, 8, 1, 128, 256, 512);
  EXPECT_EQ(needed, stage13::forward_workspace_size(1, 32, 8, 1, 131072, 128));
  EXPECT_GT(needed, 0u);
  c.workspace_bytes = needed - 1;
  expect_refused([&] { return c.run(); }, flash::StatusCode::kWorkspaceTooSmall, "needs " + std::to_string(needed));
}

// ---------------------------------------------------------------------------------------------
// Exercises: one per stage, the stage's entry with the learner's entry points
// ---------------------------------------------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every stage has an exercise.
class StageHasExercise : public ::testing::TestWithParam<registry::Stage> {};
TEST_P(StageHasExercise, ExerciseIsRegistered) {
  EXPECT_NE(registry::find_exercise(GetParam().number), nullptr)
      << "stage " << GetParam().number << " has no entry in registry::exercises()";
}

class ExerciseEntry : public ::testing::TestWithParam<registry::Stage> {
 protected:
  const registry::Stage& exercise() const { return GetParam(); }
  const registry::Stage& stage() const { return *registry::find(GetParam().number); }
};

// What the exercise accepts is its stage's; only the entry points it copies differ.
TEST_P(ExerciseEntry, MatchesItsStage) {
  ASSERT_NE(registry::find(exercise().number), nullptr);
  EXPECT_TRUE(exercise().is_exercise());
  EXPECT_FALSE(stage().is_exercise());
  EXPECT_STREQ(exercise().folder, stage().folder);
  EXPECT_STREQ(exercise().name, stage().name);
  EXPECT_EQ(exercise().causal, stage().causal);
  EXPECT_EQ(exercise().dtypes, stage().dtypes);
  EXPECT_EQ(exercise().head_dims, stage().head_dims);
  EXPECT_EQ(exercise().backward != nullptr, stage().backward != nullptr);
  if (exercise().backward)
    EXPECT_NE(exercise().backward, stage().backward) << "the exercise's backward is the stage's";
  else
    EXPECT_NE(exercise().forward, stage().forward) << "the exercise's forward is the stage's";
  EXPECT_EQ(exercise().label(), "exercise" + stage().label().substr(5));
}

// Its file is where the registry says, in exercises/<the stage's folder>/; and the stage's lesson
// links the exercise. The file's TODO(exercise) lines are not required here: a learner who solved the
// exercise as exercises/README.md says has removed them (scripts/checks/exercises.py check tells an
// unsolved file from a solved one).
TEST_P(ExerciseEntry, FileExistsAndLessonLinksIt) {
  const std::string folder = std::string("exercises/") + exercise().folder;
  EXPECT_EQ(std::string(exercise().exercise_file).rfind(folder, 0), 0u) << exercise().exercise_file;
  const std::string text = read_file(std::string(FLASH_SOURCE_DIR) + "/" + exercise().exercise_file);
  ASSERT_FALSE(text.empty()) << exercise().exercise_file << " is missing or empty";
  const std::string lesson = std::string("stages/") + exercise().folder + "/README.md";
  const std::string readme = read_file(std::string(FLASH_SOURCE_DIR) + "/" + lesson);
  EXPECT_NE(readme.find(folder), std::string::npos) << lesson << " does not link " << folder;
}

INSTANTIATE_TEST_SUITE_P(Stages, StageHasExercise,
                         ::testing::ValuesIn(stages_where([](const registry::Stage& s) { return !s.is_exercise(); })),
                         stage_label);
INSTANTIATE_TEST_SUITE_P(Exercises, ExerciseEntry, ::testing::ValuesIn(registry::exercises()), stage_label);

INSTANTIATE_TEST_SUITE_P(Stages, StageValidation,
                         ::testing::ValuesIn(stages_where([](const registry::Stage&) { return true; })), stage_label);
INSTANTIATE_TEST_SUITE_P(Stages, StageWithoutCausal,
                         ::testing::ValuesIn(stages_where([](const registry::Stage& s) { return !s.causal; })),
                         stage_label);
INSTANTIATE_TEST_SUITE_P(Stages, StageWithWorkspace,
                         ::testing::ValuesIn(stages_where([](const registry::Stage& s) {
                           return Call(s).workspace_bytes > 0;
                         })),
                         stage_label);
INSTANTIATE_TEST_SUITE_P(Stages, StageWithBackward,
                         ::testing::ValuesIn(stages_where([](const registry::Stage& s) { return s.backward != nullptr; })),
                         stage_label);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StageWithBackward);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StageWithoutCausal);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StageWithWorkspace);

}  // namespace

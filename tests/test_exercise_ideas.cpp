// The ideas of exercises 08, 09, 12, 13 and 14 checked on the CPU, from the learner's own lines, so
// that a machine without a GPU still judges them (exercises/README.md). The build copies the lines out of
// the exercise's file (scripts/checks/exercises.py extract; tests/CMakeLists.txt) into
// exerciseNN_idea.inc, and each is included below into a host function that provides the names those
// lines use. The bounds of the copy lie outside the TODO(exercise) blocks, so the same lines are found
// in the exercise as shipped, as the learner wrote it, and in the stage (FLASH_EXERCISES_SOLVED).
// Each test states the rule the lines must follow, not the stage's lines: any correct answer passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "flash_stage.cuh"  // flash::SoftmaxStats and merge_softmax_stats (host and device), float4

namespace {

std::string see(const char* file) { return std::string(" - see TODO(exercise) in ") + file; }

// ---------------------------------------------------------------------------------------------
// 08: which lane holds which element of an mma.m16n8k16 accumulator
// ---------------------------------------------------------------------------------------------

struct Owner {
  int group;            // the lane's rows: group and group + 8
  int thread_in_group;  // the lane's columns: 2 * thread_in_group and + 1
};

Owner exercise08_owner(int lane) {
#include "exercise08_idea.inc"
  return {group, thread_in_group};
}

// PTX ISA, "Matrix Fragments for mma.m16n8k16" (accumulators C/D, .f32): lane l holds c0, c1 at row
// l / 4, columns 2 (l % 4) and 2 (l % 4) + 1, and c2, c3 at the same columns of row l / 4 + 8.
TEST(exercise08, AccumulatorRowsAndColumnsOfEachLane) {
  const char* file = "exercises/08_tensor_cores/tensor_cores.cu";
  std::set<std::pair<int, int>> held;  // (row, column) of c0 and c1 over the warp
  for (int lane = 0; lane < 32; ++lane) {
    const Owner got = exercise08_owner(lane);
    EXPECT_EQ(got.group, lane / 4) << "exercise 08: lane " << lane << ": group = " << got.group
                                   << ", but its c[0] is row " << lane / 4 << see(file);
    EXPECT_EQ(got.thread_in_group, lane % 4)
        << "exercise 08: lane " << lane << ": thread_in_group = " << got.thread_in_group << ", but its c[0] is column "
        << 2 * (lane % 4) << " (2 * thread_in_group)" << see(file);
    held.insert({got.group, 2 * got.thread_in_group});
    if (HasFailure()) return;  // one lane's message says it
  }
  EXPECT_EQ(held.size(), 32u) << "exercise 08: two lanes claim the same accumulator element" << see(file);
}

// ---------------------------------------------------------------------------------------------
// 09: the swizzle
// ---------------------------------------------------------------------------------------------

constexpr int kVecElems = 8;  // the stage's 16-byte chunks of 16-bit elements

template <int kHeadDim>
int swizzled([[maybe_unused]] int row, int col) {  // the placeholder ignores the row
#include "exercise09_idea.inc"
}

// Two rules. Every row's chunks are a permutation of themselves, each chunk whole: a 16-byte copy
// stays one copy and nothing is overwritten. And the 8 rows an ldmatrix reads (rows 8m..8m+7, one
// 16-byte chunk column) lie in 8 different 16-byte slots of the 128-byte bank window: one pass.
template <int kHeadDim>
void check_swizzle() {
  const char* file = "exercises/09_swizzle_pipeline/swizzle_pipeline.cu";
  constexpr int kChunks = kHeadDim / kVecElems;
  for (int row = 0; row < 64; ++row) {
    std::set<int> chunks;
    for (int col = 0; col < kHeadDim; ++col) {
      const int at = swizzled<kHeadDim>(row, col);
      ASSERT_TRUE(at >= 0 && at < kHeadDim) << "exercise 09: head_dim " << kHeadDim << ", row " << row << ", column "
                                            << col << " is stored at column " << at << ", outside the row"
                                            << see(file);
      ASSERT_EQ(at % kVecElems, col % kVecElems)
          << "exercise 09: head_dim " << kHeadDim << ", row " << row << ", column " << col << " is stored at column "
          << at << ": a 16-byte chunk must stay whole (only whole chunks move)" << see(file);
      chunks.insert(at / kVecElems);
    }
    ASSERT_EQ(static_cast<int>(chunks.size()), kChunks)
        << "exercise 09: head_dim " << kHeadDim << ", row " << row
        << ": two chunks are stored in the same place (the swizzle must be a permutation of the row's chunks)"
        << see(file);
  }
  for (int first = 0; first < 64; first += 8)
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      std::set<int> slots;  // 16-byte slot within the 128-byte window of each row's chunk
      for (int row = first; row < first + 8; ++row)
        slots.insert((row * kChunks + swizzled<kHeadDim>(row, chunk * kVecElems) / kVecElems) % 8);
      ASSERT_EQ(slots.size(), 8u) << "exercise 09: head_dim " << kHeadDim << ": rows " << first << "-" << first + 7
                                  << " at chunk " << chunk << " share 16-byte slots of the 128-byte window: an "
                                  << 8 / slots.size() << "-way bank conflict for ldmatrix" << see(file);
    }
}

TEST(exercise09, SwizzleIsAPermutationWithoutBankConflicts) {
  check_swizzle<32>();
  check_swizzle<64>();
  check_swizzle<128>();
}

// ---------------------------------------------------------------------------------------------
// 12: the ring's buffers and barrier phases
// ---------------------------------------------------------------------------------------------

namespace exercise12 {
#include "exercise12_idea.inc"
}  // namespace exercise12

// The ring rule: the kStages tiles in flight are in kStages different buffers, a buffer is reused
// every kStages tiles (the producer waits for exactly the release kStages tiles back), and the
// parity a tile waits for is that of its buffer's use count: each use completes one phase.
template <int kStages>
void check_ring() {
  const char* file = "exercises/12_hopper/mainloop.cuh";
  std::vector<int> uses(kStages, 0);
  for (int n = 0; n < 8 * kStages; ++n) {
    const int slot = exercise12::ring_slot<kStages>(n);
    ASSERT_TRUE(slot >= 0 && slot < kStages)
        << "exercise 12: kStages " << kStages << ": tile " << n << " goes to buffer " << slot << see(file);
    if (n >= kStages) {
      ASSERT_EQ(slot, exercise12::ring_slot<kStages>(n - kStages))
          << "exercise 12: kStages " << kStages << ": tile " << n << " is not in the buffer that tile " << n - kStages
          << " freed" << see(file);
    }
    for (int back = 1; back < kStages && back <= n; ++back)
      ASSERT_NE(slot, exercise12::ring_slot<kStages>(n - back))
          << "exercise 12: kStages " << kStages << ": tiles " << n - back << " and " << n
          << " share a buffer while both are in flight" << see(file);
    const uint32_t parity = exercise12::ring_parity<kStages>(n);
    ASSERT_EQ(parity, static_cast<uint32_t>(uses[slot] & 1))
        << "exercise 12: kStages " << kStages << ": tile " << n << " is use " << uses[slot] << " of buffer " << slot
        << ", so it completes that buffer's barriers' phase " << uses[slot] << " (parity " << (uses[slot] & 1)
        << "); ring_parity says " << parity << see(file);
    ++uses[slot];
  }
}

TEST(exercise12, RingBuffersAndPhases) {
  check_ring<2>();
  check_ring<3>();
}

// ---------------------------------------------------------------------------------------------
// 13: the merge of the splits by their lse
// ---------------------------------------------------------------------------------------------

namespace exercise13 {
constexpr int kMergeBatch = 8;  // the stage's: partials loaded at once
constexpr int kHeadDim = 4;     // one thread's four columns are the whole row here

struct Merged {
  flash::SoftmaxStats stats;
  float4 acc;
};

// The merge kernel's lines for one thread of row `row`, columns [c, c + 4).
Merged merge(const float* partial_o, const float* partial_lse, long long rows, long long row, int c, int num_splits) {
#include "exercise13_idea.inc"
  return {stats, acc};
}
}  // namespace exercise13

// Keys with scores and 4-column values, cut into splits (some empty); each split's normalized o and
// lse computed in double, the learner's merge run over them, and O and lse compared with the softmax
// of all the keys.
void check_merge(const std::vector<int>& split_sizes) {
  const char* file = "exercises/13_decoding/decoding_kernel.cuh";
  const int splits = static_cast<int>(split_sizes.size());
  std::vector<float> partial_lse(splits);
  std::vector<float4> partial_o(splits);
  double total = 0.0, out[4] = {};
  std::vector<double> scores, values;
  int key = 0;
  for (int s = 0; s < splits; ++s) {
    double sum = 0.0, o[4] = {};
    for (int j = 0; j < split_sizes[s]; ++j, ++key) {
      const double score = 3.0 * std::sin(1.7 * key) + 0.5 * key / 7.0;
      for (int d = 0; d < 4; ++d) values.push_back(std::cos(0.3 * key + d));
      scores.push_back(score);
      sum += std::exp(score);
      for (int d = 0; d < 4; ++d) o[d] += std::exp(score) * values[values.size() - 4 + d];
    }
    partial_lse[s] = sum > 0.0 ? static_cast<float>(std::log(sum)) : -INFINITY;
    partial_o[s] = sum > 0.0 ? make_float4(static_cast<float>(o[0] / sum), static_cast<float>(o[1] / sum),
                                           static_cast<float>(o[2] / sum), static_cast<float>(o[3] / sum))
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    total += sum;
  }
  for (size_t j = 0; j < scores.size(); ++j)
    for (int d = 0; d < 4; ++d) out[d] += std::exp(scores[j]) / total * values[4 * j + d];
  const exercise13::Merged got = exercise13::merge(reinterpret_cast<const float*>(partial_o.data()),
                                                   partial_lse.data(), 1, 0, 0, splits);
  const float normalizer = flash::softmax_normalizer(got.stats);
  const float o[4] = {got.acc.x * normalizer, got.acc.y * normalizer, got.acc.z * normalizer, got.acc.w * normalizer};
  std::string shape = std::to_string(splits) + " split(s) of";
  for (int n : split_sizes) shape += " " + std::to_string(n);
  shape += " keys";
  const float lse = flash::softmax_lse(got.stats);
  if (total == 0.0) {
    EXPECT_EQ(lse, -INFINITY) << "exercise 13: " << shape << ": a row with no key has lse = -inf" << see(file);
  } else {
    EXPECT_NEAR(lse, std::log(total), 1e-5 * std::fabs(std::log(total)) + 1e-5)
        << "exercise 13: " << shape << ": lse of the merged row" << see(file);
  }
  for (int d = 0; d < 4; ++d)
    EXPECT_NEAR(o[d], out[d], 1e-5) << "exercise 13: " << shape << ": O column " << d << see(file);
}

TEST(exercise13, MergeOfSplitsByTheirLse) {
  check_merge({5});                          // one split: its own result
  check_merge({4, 9, 2});                    // a few
  check_merge({3, 0, 6, 1});                 // an empty split changes nothing
  check_merge({2, 5, 1, 7, 3, 4, 6, 2, 9, 1, 3});  // more than one batch of kMergeBatch
  check_merge({0, 0});                       // no key at all: O = 0, lse = -inf
}

// ---------------------------------------------------------------------------------------------
// 14: the layout of dS^T in shared memory, which dQ's wgmma reads as dS
// ---------------------------------------------------------------------------------------------

namespace exercise14 {
// The sizes of the stage's mainloop.cuh that the lines may use, with the stage's values.
[[maybe_unused]] constexpr int kWarpgroupThreads = 128;
[[maybe_unused]] constexpr int kWgmmaM = 64;
[[maybe_unused]] constexpr int kWgmmaK = 16;
[[maybe_unused]] constexpr int kElementBytes = 2;
[[maybe_unused]] constexpr int kSwizzleBytes = 128;
[[maybe_unused]] constexpr int kPanelCols = kSwizzleBytes / kElementBytes;
[[maybe_unused]] constexpr int kAtomBytes = 8 * kSwizzleBytes;
[[maybe_unused]] constexpr int kConsumers = 2;
[[maybe_unused]] constexpr int kBlockCols = kConsumers * kWgmmaM;
#include "exercise14_idea.inc"
}  // namespace exercise14

// What wgmma reads, written from the documents rather than from the stage: an MN-major operand in the
// 128-byte swizzle (PTX ISA, wgmma's "Shared Memory Matrix Layout"; CUTLASS's Swizzle<3, 4, 3>) is,
// per panel of 64 contiguous M elements (the descriptor's LBO apart: 128 key rows of 128 bytes), the
// row-major address k * 128 + 2 m with its bits 4-6 (the 16-byte chunk) XORed with its bits 7-9 (the
// row within its 1024-byte atom). For dQ = dS K, M is the query and k the key row of dS^T.
int wgmma_ds_offset(int key_row, int query) {
  constexpr int kPanelBytes = 128 * 128;
  const int linear = key_row * 128 + (query % 64) * 2;
  return (query / 64) * kPanelBytes + (linear ^ (((linear >> 7) & 7) << 4));
}

// The rules, at Br = block_rows queries (64 at head_dim 128, 128 at head_dim 64) by the block's 128
// key rows: each 16-bit element gets 2 bytes of the buffer to itself; the two queries of a 32-bit word
// of store_ds are adjacent, the word aligned; each store of a warp in store_ds (the kernel's mapping,
// FragmentPlace: lane = 4 g + t writes key row 64 consumer + 16 warp + g + 8 h, queries 8 i + 2 t and
// + 1) touches 32 different banks; and every element is where wgmma reads it.
void check_ds_layout(int block_rows) {
  const char* file = "exercises/14_hopper_backward/mainloop.cuh";
  constexpr int kKeyRows = 128;
  const int buffer_bytes = block_rows / 64 * kKeyRows * 128;
  const std::string br = "exercise 14: Br " + std::to_string(block_rows) + ": ";
  auto element = [](int key_row, int query) {
    return "dS^T[" + std::to_string(key_row) + "][" + std::to_string(query) + "]";
  };
  std::vector<int> owner(buffer_bytes / 2, -1);  // key_row * block_rows + query of each 2-byte slot
  for (int key_row = 0; key_row < kKeyRows; ++key_row)
    for (int query = 0; query < block_rows; ++query) {
      const int at = exercise14::ds_byte_offset(key_row, query);
      ASSERT_TRUE(at >= 0 && at < buffer_bytes)
          << br << element(key_row, query) << " lies at byte " << at << ", outside the buffer's " << buffer_bytes
          << " bytes (" << block_rows / 64 << " panel(s) of 128 key rows of 128 bytes)" << see(file);
      ASSERT_EQ(at % 2, 0) << br << element(key_row, query) << " lies at byte " << at
                           << ": a 16-bit element takes two bytes from an even address" << see(file);
      int& slot = owner[at / 2];
      ASSERT_EQ(slot, -1) << br << element(slot / block_rows, slot % block_rows) << " and "
                          << element(key_row, query) << " both lie at byte " << at
                          << ": each element needs two bytes of its own" << see(file);
      slot = key_row * block_rows + query;
    }
  for (int key_row = 0; key_row < kKeyRows; ++key_row)
    for (int query = 0; query < block_rows; query += 2) {
      const int at = exercise14::ds_byte_offset(key_row, query);
      const int next = exercise14::ds_byte_offset(key_row, query + 1);
      ASSERT_TRUE(at % 4 == 0 && next == at + 2)
          << br << element(key_row, query) << " lies at byte " << at << " and " << element(key_row, query + 1)
          << " at byte " << next << ": store_ds writes the two as one 32-bit word, so the second must follow the "
          << "first, at an address that is a multiple of 4" << see(file);
    }
  for (int consumer = 0; consumer < 2; ++consumer)
    for (int warp = 0; warp < 4; ++warp)
      for (int i = 0; i < block_rows / 8; ++i)
        for (int h = 0; h < 2; ++h) {
          int lanes_per_bank[32] = {};
          int worst = 0;
          for (int lane = 0; lane < 32; ++lane) {
            const int key_row = 64 * consumer + 16 * warp + lane / 4 + 8 * h, query = 8 * i + 2 * (lane % 4);
            const int bank = exercise14::ds_byte_offset(key_row, query) / 4 % 32;
            worst = std::max(worst, ++lanes_per_bank[bank]);
          }
          const int first_row = 64 * consumer + 16 * warp + 8 * h;
          ASSERT_EQ(worst, 1) << br << "store_ds's store of warp " << warp << " of consumer " << consumer
                              << " (key rows " << first_row << "-" << first_row + 7 << ", queries " << 8 * i << "-"
                              << 8 * i + 7 << "): " << worst << " of its 32 lanes write one bank, so the store takes "
                              << worst << " passes (32 words, 32 banks: each lane needs a bank of its own)"
                              << see(file);
        }
  for (int key_row = 0; key_row < kKeyRows; ++key_row)
    for (int query = 0; query < block_rows; ++query) {
      const int at = exercise14::ds_byte_offset(key_row, query), wgmma = wgmma_ds_offset(key_row, query);
      ASSERT_EQ(at, wgmma) << br << element(key_row, query) << " lies at byte " << at
                           << ", but dQ's wgmma reads dS[" << query << "][" << key_row << "] at byte " << wgmma
                           << " (an MN-major A in the 128-byte swizzle, the stage's descriptors: panels of 64 "
                           << "queries 16384 bytes apart, 8-row groups 1024 bytes apart)" << see(file);
    }
}

TEST(exercise14, DsLayoutIsWhatWgmmaReadsWithoutBankConflicts) {
  check_ds_layout(64);
  if (HasFatalFailure()) return;
  check_ds_layout(128);
}

}  // namespace

// Stage 12's work order: which work tile (Br query rows of one head) a block takes next. The kernels
// ask it for their step-th work tile and never see how the order is made; the host makes the numbers
// it runs on (TileSchedule) for one launch.
//
// Two orders run:
// - one block per work tile (the in-order kernel): block b takes work unit b, query tiles head by head;
// - persistent blocks (the ping-pong kernel): one block per SM, each taking a work unit in every pass
//   over the grid, in serpentine order. Causal, a unit is a pair of query tiles of one head, the pairs
//   head by head, then the last heads' query tiles one at a time, longest first (the tail).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace stage12 {

// A division by a number that is the same for the whole grid (a head count, the units per head), as
// a multiply-high, an add and a shift: the division instruction sequence is a chain of a reciprocal
// and corrections on every work tile's search, which the consumers wait for between work tiles.
// Granlund and Montgomery's round-up method ("Division by invariant integers using multiplication",
// 1994): with shift = ceil(log2 d) and multiplier = floor(2^32 (2^shift - d) / d) + 1,
// n / d = (umulhi(n, multiplier) + n) >> shift for every n < 2^31 (the sum then fits 32 bits).
struct GridDivisor {
  uint32_t divisor, multiplier, shift;
};

__host__ inline GridDivisor make_grid_divisor(int d) {
  GridDivisor g{static_cast<uint32_t>(d), 0, 0};
  while ((1ull << g.shift) < g.divisor) ++g.shift;
  g.multiplier = static_cast<uint32_t>(((1ull << 32) * ((1ull << g.shift) - g.divisor)) / g.divisor + 1);
  return g;
}

// n / g.divisor for 0 <= n < 2^31; remainder() gives n % g.divisor from that quotient.
__device__ inline int divide(int n, const GridDivisor& g) {
  const uint32_t u = static_cast<uint32_t>(n);
  return static_cast<int>((__umulhi(u, g.multiplier) + u) >> g.shift);
}
__device__ inline int remainder(int n, int quotient, const GridDivisor& g) {
  return n - quotient * static_cast<int>(g.divisor);
}

// The work units of a grid: each a work tile when tiles_per_unit is 1, or a pair of them when it is
// 2, the query tiles i and num_q_tiles - 1 - i of one head. A causal pair sees as many K/V tiles as
// any other, so blocks that take one pair each in turn end together without a longest-first order
// across heads; and the pairs come head by head, so the blocks in flight read the K and V of a few
// heads, which stay in L2, where longest first runs one query tile of every head at once.
// With pairs, the last tail_heads heads come after the pairs of all the others, one query tile a
// unit, longest first across those heads: units of one tile and of every length let the blocks of the
// last pass end together, where pairs, all of the same size, left the SMs without a pair idle.
// Fewer than 2^31 of them: num_heads_total * num_q_tiles <= batch * heads_q * seq_q, which
// flash::check_forward_args keeps within kMaxDim.
__host__ __device__ inline int units_per_head(int num_q_tiles, int tiles_per_unit) {
  return tiles_per_unit == 2 ? (num_q_tiles + 1) / 2 : num_q_tiles;
}
__host__ __device__ inline int num_pair_units(int num_heads_total, int num_q_tiles, int tiles_per_unit,
                                              int tail_heads) {
  return (num_heads_total - tail_heads) * units_per_head(num_q_tiles, tiles_per_unit);
}
__host__ __device__ inline int num_work_units(int num_heads_total, int num_q_tiles, int tiles_per_unit,
                                              int tail_heads) {
  return num_pair_units(num_heads_total, num_q_tiles, tiles_per_unit, tail_heads) + tail_heads * num_q_tiles;
}

// The numbers a launch's work order runs on, made on the host (block_per_tile_schedule,
// persistent_schedule), a kernel parameter. unit_divisor divides a unit's index by the units of a head;
// tail_divisor by tail_heads (1 when there is no tail).
struct TileSchedule {
  int num_q_tiles;      // query tiles of a head
  int num_heads_total;  // batch * heads_q
  int tiles_per_unit;   // 1, or 2: query tiles in pairs
  int tail_heads;       // heads whose tiles come one at a time after the pairs
  GridDivisor unit_divisor, tail_divisor;
};

// A TileSchedule and the grid it is made for.
struct ScheduledGrid {
  TileSchedule schedule;
  int blocks;
};

// One block per work tile, query tiles head by head: one pass over the grid.
__host__ inline ScheduledGrid block_per_tile_schedule(int num_heads_total, int num_q_tiles) {
  const TileSchedule s{num_q_tiles, num_heads_total, 1, 0, make_grid_divisor(num_q_tiles), make_grid_divisor(1)};
  return {s, num_work_units(num_heads_total, num_q_tiles, 1, 0)};
}

// One block per SM taking work units in turn. Causal work tiles one at a time spread each pass over
// min(heads, SMs) heads, so that a head's next query tile comes passes later, after its K and V have
// left the L2; causal units are therefore pairs of query tiles, head by head, at any head count.
// A pair is twice the work of a tile, though, so the last pass would leave SMs idle: the tail is about
// one pass of pairs (num_sms of them), in whole heads, one query tile a unit. The pairs that do not fill
// the last pass are what leaves SMs idle; single tiles of every length, longest first, give the
// serpentine order short tiles to even the last pass out with. Whole heads, so that a tail unit's head
// and query tile come from one division (tail_divisor). "One pass" is not derived: it is the size
// measured to gain on every cell that takes pairs (see docs/experiments/stage12.md).
// One block per SM is all that fits: the registers of 384 threads at 168 each (setmaxnreg).
__host__ inline ScheduledGrid persistent_schedule(int num_heads_total, int num_q_tiles, bool causal, int num_sms) {
  const int tiles_per_unit = causal ? 2 : 1;
  const int units_of_head = units_per_head(num_q_tiles, tiles_per_unit);
  const int tail_heads = causal ? std::min(num_heads_total, (num_sms + units_of_head - 1) / units_of_head) : 0;
  const TileSchedule s{num_q_tiles, num_heads_total, tiles_per_unit, tail_heads, make_grid_divisor(units_of_head),
                       make_grid_divisor(std::max(1, tail_heads))};
  return {s, std::min(num_work_units(num_heads_total, num_q_tiles, tiles_per_unit, tail_heads), num_sms)};
}

// The order on the device. Block b's work unit in pass p over the grid: b in even passes,
// gridDim.x - 1 - b in odd ones (a serpentine order). Causal work tiles come longest first, so the
// block that takes a pass's longest tile takes the next pass's shortest, and the blocks of a
// persistent grid end at about the same time; in the order b, b + gridDim.x, ... block 0 took the
// longest tile of every pass. A grid with a block per work unit has one pass.
struct TileScheduler {
  TileSchedule s;
  int num_units, pair_units;
  // Unsigned: past the last unit, a pass's index may reach num_units + gridDim.x - 1 > 2^31 - 1.
  unsigned grid, block;
  int num_steps;  // a step per work tile the block may take: tiles_per_unit per pass

  __device__ explicit TileScheduler(const TileSchedule& schedule)
      : s(schedule),
        num_units(num_work_units(s.num_heads_total, s.num_q_tiles, s.tiles_per_unit, s.tail_heads)),
        pair_units(num_pair_units(s.num_heads_total, s.num_q_tiles, s.tiles_per_unit, s.tail_heads)),
        grid(gridDim.x),
        block(blockIdx.x) {
    const int num_passes = static_cast<int>((static_cast<unsigned>(num_units) + grid - 1) / grid);
    num_steps = num_passes * s.tiles_per_unit;
  }

  __device__ unsigned unit_of_pass(int pass) const {
    return static_cast<unsigned>(pass) * grid + (pass % 2 == 0 ? block : grid - 1 - block);
  }

  // The block's step-th work tile, (bh = batch * heads_q + query head, q_tile): the first or second
  // of pass step / tiles_per_unit's unit. False when there is none: past the last unit, the second
  // of a pair that is one tile, or the second step of a unit of the tail, which is one tile.
  __device__ bool tile_of_step(int step, int& bh, int& q_tile) const {
    const bool pairs = s.tiles_per_unit == 2;
    const unsigned next = unit_of_pass(pairs ? step / 2 : step);
    if (next >= static_cast<unsigned>(num_units)) return false;
    const int unit = static_cast<int>(next);
    const bool second = pairs && step % 2 == 1;
    if (unit >= pair_units) {
      // The tail (pairs only): level l holds query tile num_q_tiles - 1 - l of each of its heads.
      if (second) return false;
      const int tail_unit = unit - pair_units;
      const int level = divide(tail_unit, s.tail_divisor);
      bh = s.num_heads_total - s.tail_heads + remainder(tail_unit, level, s.tail_divisor);
      q_tile = s.num_q_tiles - 1 - level;
    } else {
      const int quotient = divide(unit, s.unit_divisor);
      const int rest = remainder(unit, quotient, s.unit_divisor);
      bh = quotient;
      if (pairs) {
        // Pair i = rest of head quotient: query tile num_q_tiles - 1 - i, then tile i. Causal, the two
        // see num_q_tiles + 1 K/V tiles together (with Br = Bc and seq_q = seq_kv), whatever i is.
        const int i = rest;
        if (second && i == s.num_q_tiles - 1 - i) return false;  // the middle tile of an odd count
        q_tile = second ? i : s.num_q_tiles - 1 - i;
      } else {
        q_tile = rest;
      }
    }
    return true;
  }
};

}  // namespace stage12

#!/usr/bin/env python3
"""A model of stage 14's grid ending: the main kernel's blocks, in launch order, handed to 132 SMs one
block per SM as each SM comes free (a list schedule), each block taking as long as its steps (the query
tiles that see its keys) plus a fixed start-and-end cost. Printed per cell of the FlashAttention grid
(B·N = 16384, H·d = 2048), with the causal mask, for the two block orders of experiments page 14: a head
at a time, and waves of max(1, 132 / K) heads in key-tile order (K key tiles a head). Each figure is the
grid's end over the work spread evenly over the SMs (1.000: no SM idles before the end). A model, not a
measurement: it leaves out the L2, the clocks and the blocks' differing speeds.

    python3 scripts/docs/block_order_model.py > bench/results/stage14_block_order_model.txt
"""
import heapq

SMS = 132
KEY_TILE = 128  # B_c
START_END_STEPS = (0, 2, 5)  # a block's cost outside its steps, in steps: three guesses


def grid_end(durations):
    free = [0.0] * SMS
    end = 0.0
    for d in durations:
        start = heapq.heappop(free)
        heapq.heappush(free, start + d)
        end = max(end, start + d)
    return end


def durations(n, head_dim, heads_per_wave, start_end):
    """The blocks' times in launch order: waves of heads_per_wave K/V heads, key tile first in a wave."""
    heads = (16384 // n) * (2048 // head_dim)
    key_tiles = n // KEY_TILE
    rows = 128 if head_dim == 64 else 64  # B_r
    q_tiles = n // rows
    out = []
    for first in range(0, heads, heads_per_wave):
        for kt in range(key_tiles):
            steps = q_tiles - kt * KEY_TILE // rows  # causal: the tiles from the key tile's diagonal on
            out += [steps + start_end] * (min(heads, first + heads_per_wave) - first)
    return out


def main():
    print("# scripts/docs/block_order_model.py: the grid's end over the work spread evenly, causal, 132 SMs")
    print("head_dim N start_end_steps head_at_a_time waves_of_heads heads_per_wave")
    for head_dim in (64, 128):
        for n in (1024, 2048, 4096, 8192, 16384):
            wave = max(1, SMS // (n // KEY_TILE))
            for start_end in START_END_STEPS:
                by_head = durations(n, head_dim, 1, start_end)
                by_wave = durations(n, head_dim, wave, start_end)
                even = sum(by_head) / SMS
                print(f"{head_dim} {n} {start_end} {grid_end(by_head) / even:.3f} {grid_end(by_wave) / even:.3f} {wave}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A model of stage 12's shared-memory addressing, checked without a GPU.

Two facts from NVIDIA's documents, written as code:
  - the copy engine's CU_TENSOR_MAP_SWIZZLE_128B (cuda.h, cuTensorMapEncodeTiled: "swizzle 16B
    chunks within 128B span") and wgmma's 128-byte swizzle mode (PTX ISA, shared memory matrix
    layout: Swizzle<3,4,3>) are the same function of the shared-memory byte address: the 16-byte
    chunk index, address bits 4-6, is XORed with bits 7-9;
  - wgmma reads its operands by the canonical layouts of the PTX ISA
    (#asynchronous-warpgroup-level-canonical-layouts), for 16-bit elements (T = 8):
      K-major,  128B swizzle: ((8, m), (T, 2k)) : ((8T, SBO), (1, T))
      MN-major, 128B swizzle: ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))
    (strides in elements), the swizzle applied to the address that results.

The model stores Q, K and V tiles as stage 12's producer does (kPanels column panels of 64 elements,
each a TMA box written with the swizzle), then reads every operand element of every wgmma through
the descriptors stage 12 builds (stages/12_hopper/mainloop.cuh: k_major_descriptor,
mn_major_descriptor) and checks that each is the element the product needs. It checks the
arithmetic of the offsets, LBO and SBO against the documents as read here; it cannot check the
reading itself, which only the GPU tests do. The constants below repeat the kernel's: keep them
in step.
"""
import sys

SWIZZLE_BYTES = 128  # kSwizzleBytes
ATOM_BYTES = 1024    # kAtomBytes: 8 rows of 128 bytes
SBO = ATOM_BYTES     # kSbo: one group of 8 rows to the next
K_STEP_BYTES = 32    # kKStepBytes: 16 elements of 2 bytes
WGMMA_M = 64         # kWgmmaM: one consumer warpgroup's rows
PANEL_COLS = 64      # kPanelCols


def swizzle(address):
    return address ^ (((address >> 7) & 7) << 4)


def store_tile(memory, base, rows, panels, name):
    """The copy engine writing a [rows, 64 * panels] tile, one box per 64-column panel."""
    for p in range(panels):
        for r in range(rows):
            for c in range(PANEL_COLS):
                memory[swizzle(base + p * rows * SWIZZLE_BYTES + r * SWIZZLE_BYTES + 2 * c)] = (name, r, 64 * p + c)


def k_major(memory, start, mn, k):
    """Element (mn, k) of a K-major operand at descriptor start address `start`, k < 16."""
    return memory[swizzle(start + (mn % 8) * SWIZZLE_BYTES + (mn // 8) * SBO + 2 * k)]


def mn_major(memory, start, lbo, n, k):
    """Element (k, n) of an MN-major operand, k < 16."""
    return memory[swizzle(start + 2 * (n % 64) + (n // 64) * lbo + (k % 8) * SWIZZLE_BYTES + (k // 8) * SBO)]


def check(head_dim, block_cols, base=ATOM_BYTES):
    panels = head_dim // PANEL_COLS
    q_panel, kv_panel = WGMMA_M * SWIZZLE_BYTES, block_cols * SWIZZLE_BYTES
    q_base = base
    k_base = q_base + panels * q_panel
    v_base = k_base + panels * kv_panel
    assert all(b % ATOM_BYTES == 0 for b in (q_base, k_base, v_base, q_panel, kv_panel)), "tiles start on atoms"
    memory = {}
    store_tile(memory, q_base, WGMMA_M, panels, "Q")
    store_tile(memory, k_base, block_cols, panels, "K")
    store_tile(memory, v_base, block_cols, panels, "V")
    steps_per_panel = SWIZZLE_BYTES // K_STEP_BYTES
    # S = Q K^T: k-step ks reads Q[m][16 ks + kk] (A, K-major) and K[n][16 ks + kk] (B, K-major).
    for ks in range(head_dim // 16):
        offset = (ks % steps_per_panel) * K_STEP_BYTES
        q_start = q_base + (ks // steps_per_panel) * q_panel + offset
        k_start = k_base + (ks // steps_per_panel) * kv_panel + offset
        for kk in range(16):
            for m in range(WGMMA_M):
                assert k_major(memory, q_start, m, kk) == ("Q", m, 16 * ks + kk), ("Q", head_dim, ks, m, kk)
            for n in range(block_cols):
                assert k_major(memory, k_start, n, kk) == ("K", n, 16 * ks + kk), ("K", head_dim, ks, n, kk)
    # O += P V: k-step ks reads V[16 ks + kk][n] (B, MN-major, LBO = one panel).
    for ks in range(block_cols // 16):
        v_start = v_base + ks * 16 * SWIZZLE_BYTES
        for kk in range(16):
            for n in range(head_dim):
                assert mn_major(memory, v_start, kv_panel, n, kk) == ("V", 16 * ks + kk, n), ("V", ks, n, kk)


# The (head_dim, keys per K/V tile) pairs stage 12 runs (stages/12_hopper/hopper.cu, launch): 128 keys
# at both head_dims, 160 at head_dim 64 on long causal sequences.
SHAPES_THAT_RUN = ((64, 128), (64, 160), (128, 128))


def main():
    for head_dim, block_cols in SHAPES_THAT_RUN:
        check(head_dim, block_cols)
        print(f"head_dim {head_dim}, {block_cols} keys per tile: every operand element where the copy engine put it")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Whether stage 12's softmax overlaps its P V product in the machine code: for each instance of the
# ping-pong kernel (the one with the intra-warpgroup overlap), how many MUFU (the softmax's exp2) lie
# between each wait for S (WARPGROUP.DEPBAR.LE gsb0, 0x1) and the wait for P V after it
# (WARPGROUP.DEPBAR.LE gsb0, 0x0). ptxas may move a wgmma.wait_group past ordinary instructions: a 0
# here means the exponentials wait for the product (lesson 12, "Intra-warpgroup overlap"). No GPU needed; compiles hopper.cu as the build does
# for Hopper. Usage: scripts/profile/sass_overlap.sh   (needs nvcc and cuobjdump on PATH)
set -euo pipefail
cd "$(dirname "$0")/../.."
obj=$(mktemp -d)
trap 'rm -rf "$obj"' EXIT
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DFLASH_STAGE12_SM90A=1 -I common \
  -cubin stages/12_hopper/hopper.cu -o "$obj/hopper.cubin"
# pingpong_kernel's instances (the in-order kernel waits for each product before its softmax): the
# template arguments left of the parameter list, e.g. 6__halfLi64ELb1ENS_9TileShapeILi2ELi160ELi2E.
cuobjdump -sass "$obj/hopper.cubin" | awk '
  /Function :/ { name = $3; sub(/.*pingpong_kernelI/, "", name); sub(/EEEEEv.*/, "", name); waiting = 0 }
  /DEPBAR.LE gsb0, 0x1/ { waiting = 1; exps = 0; next }
  /DEPBAR.LE gsb0, 0x0/ { if (waiting) { print name ": " exps " MUFU between the waits"; waiting = 0 } next }
  /MUFU/ { exps++ }' | sort | uniq -c

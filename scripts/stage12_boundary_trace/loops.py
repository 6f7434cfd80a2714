#!/usr/bin/env python3
"""The K/V loops of each kernel in cuobjdump's SASS, counted in instructions: a loop is a predicated backward branch
over 0x3000 to 0x8000 bytes (stage 12's loop bodies at head_dim 64; the first two such are the loop of unmasked pairs
and the loop of masked pairs), printed with the kernel's configuration and its total instruction count, and how
many R2UR each holds (a value moved from a thread's registers to the warp's uniform ones).

    cuobjdump -sass BIN | python3 scripts/stage12_boundary_trace/loops.py
"""
import re
import sys

for part in sys.stdin.read().split("Function : ")[1:]:
    name = part.split("\n")[0].strip()
    config = re.sub(r"EEEEv.*", "", re.sub(r".*hopper_kernelI", "", name))
    code, loops = [], []
    for line in part.split("\n"):
        m = re.search(r"/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line)
        if m:
            code.append((int(m.group(1), 16), m.group(2)))
    for offset, text in code:
        b = re.search(r"BRA (0x[0-9a-f]+)", text)
        if b and text.startswith("@") and 0x3000 < offset - int(b.group(1), 16) < 0x8000:
            start = int(b.group(1), 16)
            r2ur = sum(1 for o, t in code if start <= o <= offset and "R2UR" in t)
            loops.append(f"{(offset - start) // 16} ({r2ur} R2UR)")
    print(f"{config}: {len(code)} instructions, loops {', '.join(loops[:2])}")

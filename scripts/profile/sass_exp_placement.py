#!/usr/bin/env python3
"""Where a kernel's exp2 (MUFU.EX2) sit among its mma (HMMA) in SASS: lesson 11's count.

Usage: cuobjdump -sass backward_tc.cubin > backward_tc.sass
       scripts/profile/sass_exp_placement.py backward_tc.sass 'dk_dv_kernelI13__nv_bfloat16Li64ELb0ELNS_6DqModeE2E.*ELi128ELi1E'

For each function whose mangled name matches the pattern: its instruction count, its MUFU.EX2 and HMMA
instructions, and how many of the MUFU.EX2 have an HMMA within WINDOW instructions both before and
after them (issued among mma, not in a block of their own).
"""
import bisect
import re
import sys

WINDOW = 8  # instructions: a few issue slots either side, well inside one warp's mma sequence


def functions(text):
    """{mangled name: [opcode, ...]} in program order."""
    found, name = {}, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m[1]
            found[name] = []
            continue
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9]+(\.[A-Z0-9_]+)*)", line)
        if m and name:
            found[name].append(m[2])
    return found


def main():
    text = open(sys.argv[1]).read()
    for name, ops in functions(text).items():
        if not re.search(sys.argv[2], name):
            continue
        exps = [i for i, op in enumerate(ops) if op.startswith("MUFU.EX2")]
        mmas = [i for i, op in enumerate(ops) if op.startswith("HMMA")]
        among = 0
        for i in exps:
            j = bisect.bisect(mmas, i)
            if 0 < j < len(mmas) and mmas[j] - i <= WINDOW and i - mmas[j - 1] <= WINDOW:
                among += 1
        print(f"{name}: {len(ops)} instructions, {len(mmas)} HMMA, {len(exps)} MUFU.EX2, {among} of them among HMMA")


if __name__ == "__main__":
    main()

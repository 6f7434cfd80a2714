#!/usr/bin/env python3
"""Nsight Compute's source view of one kernel, reduced, and where its long-scoreboard stalls sit.

  ncu --section SourceCounters --section WarpStateStats -o rep -k regex:dk_dv_kernel -c 1 <program>
  ncu -i rep.ncu-rep --page source --csv --print-source sass > raw.csv
  scripts/profile/ncu_source_summary.py reduce raw.csv > reduced.csv   # per instruction: SASS and stalls
  scripts/profile/ncu_source_summary.py report reduced.csv             # lesson 11's shares
  scripts/profile/ncu_source_summary.py regions reduced.csv NAME:LO:HI ...  # samples per range of offsets

reduce keeps, per SASS instruction, its offset from the kernel's first instruction, the instruction,
its warp-stall sample count and its samples per stall reason (the other columns of the source view
go). report prints
each reason's share of all samples, and the long-scoreboard samples of instructions that follow a
red.global.add (REDG) or a local or global load (LDL, LDG) within WINDOW instructions: the operation
whose result, or whose reading of its registers, they wait for.
"""
import csv
import sys

WINDOW = 12  # instructions: a step's REDG group and the address arithmetic that follows it
REASONS = ("stall_long_sb", "stall_short_sb", "stall_wait", "stall_barrier", "stall_math", "stall_mio",
           "stall_lg", "stall_not_selected", "stall_selected", "stall_branch_resolving", "stall_dispatch",
           "stall_no_inst", "stall_drain")


def reduce(path):
    rows = list(csv.reader(open(path)))
    header, data = rows[1], rows[2:]
    col = {h: i for i, h in enumerate(header)}
    base = int(data[0][col["Address"]], 16)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(("offset", "sass", "samples") + REASONS)
    for r in data:
        samples = int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        out.writerow((f"{int(r[col['Address']], 16) - base:#x}", r[col["Source"]].strip(), samples) +
                     tuple(int(r[col[k]] or 0) for k in REASONS))


def opcode(sass):
    """The opcode of one SASS line, past its predicate (`@P0 REDG.E.ADD...` -> `REDG.E.ADD...`)."""
    tokens = sass.split()
    return tokens[1] if tokens[0].startswith("@") else tokens[0]


def report(path):
    rows = list(csv.DictReader(open(path)))
    total = sum(int(r["samples"]) for r in rows)
    print(f"{total} samples")
    for k in REASONS:
        print(f"  {k}: {sum(int(r[k]) for r in rows) / total:.3f}")
    for tag, ops in (("REDG", ("REDG",)), ("LDL or LDG", ("LDL", "LDG"))):
        marks = [i for i, r in enumerate(rows) if opcode(r["sass"]).startswith(ops)]
        waited = sum(int(r["stall_long_sb"]) for i, r in enumerate(rows) if any(0 < i - m <= WINDOW for m in marks))
        print(f"  stall_long_sb within {WINDOW} instructions after {tag}: {waited / total:.3f}")


def regions(path, *ranges):
    """The warp-stall samples of each range [LO, HI) of instruction offsets (hex), and of all."""
    rows = list(csv.DictReader(open(path)))
    print(f"all: {sum(int(r['samples']) for r in rows)}")
    for spec in ranges:
        name, lo, hi = spec.split(":")
        n = sum(int(r["samples"]) for r in rows if int(lo, 16) <= int(r["offset"], 16) < int(hi, 16))
        print(f"{name}: {n}")


if __name__ == "__main__":
    {"reduce": reduce, "report": report, "regions": regions}[sys.argv[1]](*sys.argv[2:])

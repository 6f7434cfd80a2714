#!/usr/bin/env python3
"""Turns measured results into the Markdown tables of README.md and the lessons.

Every figure in those tables comes from a file under bench/results/, written on the GPU machine by
scripts/device/gpu_check.sh (the benchmark's JSON and the runner's output). Nothing is typed by hand:

    python3 scripts/docs/make_tables.py --update README.md stages/*/README.md docs/results.md docs/experiments/*.md

rewrites each region between `<!-- table:NAME -->` and `<!-- /table:NAME -->` with table NAME:
  course      every stage at batch 4, 16 heads, seq 4096, head_dim 64 and 128 (non-causal; causal
              for the stages that support it): TFLOP/s, share of the fp32 peak, speedup
  stage-NN    stage NN over sequence lengths 512 .. 16384
  backward    the backward of every stage that has one, over the same lengths
  runner      the course runner's table, verbatim
  compare     the stages against PyTorch's attention backends (bench/compare.py's table)
  backward-split  the time of each of stage 07's backward kernels (Nsight Compute)
  ptxas-backward  registers and spills of stage 07's kernels (ptxas, bench/results/ptxas_sm90.txt)
  ptxas-stage11   registers and spills of stage 11's kernels per head_dim (the same file)
  ncu-dNN     Nsight Compute metrics of the fused kernels (stages 03-06) at head_dim NN, one row per
              metric, one column per stage, from bench/results/h100_ncu_dNN.csv
              (scripts/profile/profile_stages.sh NN); plus FP32 TFLOP/s achieved = 2 x FFMA / kernel time, and
              the share of instructions that are not FFMA where the CSV counts all instructions
  ncu-kernels-dNN  the same metrics for the stages profiled as several kernels (01, 02: scores,
              softmax, P V; 07: its backward's three), one column per kernel
  stage05-ablation  stage 04 -> 05 one change at a time (bench/stage05_ablation.cu's output,
              bench/results/h100_stage05_ablation.txt, written by scripts/device/gpu_check_ablation.sh)
  stage06-order  from the same file: stage 06's causal/non-causal ratio, its heaviest-first order
              against the natural order
              (scripts/profile/profile_stages.sh NN); plus FP32 TFLOP/s achieved = 2 x FFMA / kernel time
  stage12-compare  stage 12 in bench/compare.py's bf16 and fp16 runs: TFLOP/s and its speed over stage 10,
              FlashAttention-2 and cuDNN per cell, with the geometric means
  stage12-variants-dNN  stage 12 one piece at a time at head_dim NN (bench/stage12_variants.cu's output,
              bench/results/h100_stage12_variants_*.txt), bf16 and fp16, causal and not; "not run" where
              no committed run holds the whole block
  stage12-steps   from the same files: what each piece buys at N = 16384, and how far apart the two rows
              that time the registered kernel are
  stage12-after-b  from the same files: version B, then the three pieces after it, every block
  ncu-stage12     Nsight Compute of stage 12's kernel at head_dim 64 and 128
              (bench/results/h100_ncu_stage12_dNN.csv and _tensor.csv)
  decode-bench    stage 13's decode family of the benchmark (bench/results/h100_bench_decode.json):
              GB/s over the K and V bytes, contiguous and paged, and their share of the HBM datasheet
  decode-compare  stage 13 against SDPA's flash backend (bench/compare.py --decode's table,
              bench/results/compare_h100_decode.md)
  decode-splits-B-N  stage 13 at forced split counts at batch B, cache length N (bench/stage13_splits.cu's
              output, bench/results/h100_stage13_splits.txt): µs and GB/s per split count, the count
              choose_splits picks marked
  stage11-backward-bf16, stage11-backward-fp16  stage 11's backward (both modes) against FlashAttention-2
              (sdpa-flash) and cuDNN: TFLOP/s, stage11 / flash and stage11-det / stage11 per cell, with
              their geometric means over N >= 1024 (from compare_h100_bf16.json, compare_h100_fp16.json)
  stage11-steps  dk_dv_kernel's barrier and query-step changes, one after the other
              (bench/results/h100_stage11_steps.txt, flash-stages-bench rounds): ms per backward call,
              the fastest round of each version, and its speed over the version it was timed against
  stage11-2d  2D warp grids at both head_dims, then 128 query rows at head_dim 64, each against the
              kernel before it in the same run (h100_stage11_steps.txt): ms per backward call, the
              fastest of two rounds, and the speed-up
  stage11-order  the block order and P before dP, each against the kernel before it in the same run
              (h100_stage11_steps.txt): ms per backward call, the fastest round
  stage11-bulk   dQ's share added by one bulk copy per warp, and the lse/D loads a step ahead on top of it
  stage11-p-variants  the ways of placing P between the score products, and four changes on the kept
              kernel, each as a speed-up over the kernel it was timed against (h100_stage11_steps.txt)
  stage11-vs-fa2  stage 11's dk_dv_kernel and FlashAttention-2's main backward kernel in Nsight Compute,
              same problem and sections: time, instructions by pipe, spills, stalls per issued instruction
  ncu-stage11 each kernel of one stage 11 backward call at head_dim 64 and 128 (Nsight Compute, first
              call): time, registers, warps active, SM, tensor pipe, busiest memory unit and DRAM
              throughput, share of the call (h100_ncu_stage11_dD.csv and _tensor.csv)
  stage14-standing  stage 14's backward in a paragraph: geometric means over N >= 1024 of its speed over
              cuDNN, FlashAttention-2 and stage 11 in both dtypes, the lowest cell, the deterministic mode's
              speed over the default's (compare_h100_bf16.json, compare_h100_fp16.json)
  stage14-compare  stage 14's backward per cell at N = 4096 and 16384, bf16 and fp16: TFLOP/s, its speed over
              stage 11, FlashAttention-2 and cuDNN, and det / default, with the geometric means over N >= 1024
  ncu-stage14 stage 14's backward_kernel beside stage 11's dk_dv_kernel in Nsight Compute, head_dim 128 and 64
              (bench/results/h100_ncu_stage14.csv, scripts/profile/profile_stage14.sh)
Both decode tables say "not measured yet" and name the script until their file is committed
(scripts/device/gpu_check_decode.sh writes both); so do the three tables of stage 14 (and the inline
phrase value:stage14-summary/short) until the compare runs hold `stage14` cells and the profile exists.

Single figures in running text are generated the same way, inline:

    <!-- value:SPEC -->31.69<!-- /value -->

where SPEC names one measured figure (see `value()` in tables/common.py for the forms), e.g.
`bench/05/d64/c0/4096/tflops`, `speedup/04/05/d64`, `compare/naive-torch/backward/d64/c0/4096`,
`anchor/fp32-matmul`. The figure between the markers is rewritten by --update like a table.

    python3 scripts/docs/make_tables.py --check [FILES]

changes nothing and exits 1 if any table or inline figure in FILES (default: every Markdown page of
the course that may hold markers, PAGES in tables/common.py) differs from what bench/results/ gives, or needs a file bench/results/ does not have (it
names the file); ctest runs it (label cpu) and so does CI.
Without --update or --check it prints every table. The tables and figures are made by the package
scripts/docs/tables/, one module per family of pages.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tables import (DECODE_BENCH, PAGES, ROOT, Values, check, load_bench, load_decode_bench,  # noqa: E402
                    tables, update, value)

# What docs/build_site.py uses when it imports this file as a module.
__all__ = ["DECODE_BENCH", "Values", "load_bench", "load_decode_bench", "tables", "value"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", nargs="+", type=pathlib.Path, help="files whose generated regions to rewrite")
    parser.add_argument("--check", nargs="*", type=pathlib.Path,
                        help="files to check (default: every course page); exit 1 if any region is stale")
    args = parser.parse_args()
    all_tables = tables()
    values = Values()
    if args.check is not None:
        paths = args.check or sorted({p for pattern in PAGES for p in ROOT.glob(pattern)})
        return check(paths, all_tables, values)
    if args.update:
        for path in args.update:
            update(path, all_tables, values)
    else:
        for name, table in all_tables.items():
            print(f"## {name}\n\n{table}\n")


if __name__ == "__main__":
    raise SystemExit(main())

"""What every page family shares: the results folder and its files, the loaders of the files more than one
page reads, and the registry of inline figures (value:SPEC), whose kinds the page modules register."""
import csv
import json
import math
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[3]


BENCH = ROOT / "bench/results/h100_bench.json"


RUNNER = ROOT / "bench/results/h100_runner.txt"


RESULTS = ROOT / "bench/results"


COMPARE = ROOT / "bench/results/compare_h100.md"


NCU_BACKWARD = ROOT / "bench/results/h100_ncu_backward.csv"


COMPARE_JSON = ROOT / "bench/results/compare_h100.json"


ANCHORS = ROOT / "bench/results/pytorch_anchors_h100.md"


DECODE_BENCH = ROOT / "bench/results/h100_bench_decode.json"


DECODE_COMPARE = ROOT / "bench/results/compare_h100_decode.md"


DECODE_SPLITS = ROOT / "bench/results/h100_stage13_splits.txt"


# The half stages' targets ask for no cell below 0.9x the peer (the issues of stages 10 to 12).
TARGET_FLOOR = 0.9


# The Markdown pages whose generated regions --check covers when it is given no files.
PAGES = ["README.md", "docs/mainpage.md", "docs/theory/*.md", "stages/*/README.md", "docs/results.md",
         "docs/experiments/*.md"]


# H100 SXM datasheet FP32 (FFMA) peak, as quoted in bench/results/pytorch_anchors_h100.md (checked
# against that file by value("anchor/peak-fp32") whenever the tables are made).
FP32_PEAK_TFLOPS = 67.0


COURSE_SEQ = 4096


# The two grids of the committed results, named once.
COURSE_GRID = ("Course grid: B·N = 16384 tokens and 16 heads at every head_dim (`bench/bench_stages.cpp`); at "
               "head_dim 128 it is the FlashAttention benchmark grid (H·d = 2048), at head_dim 64 that grid has "
               "32 heads (the PyTorch comparison, `bench/compare.py`).")


NAME = re.compile(r"stage(\d\d)_(\w+)/d(\d+)/causal(\d)/(backward/)?seq:(\d+)")


# Table name -> the results file it is made from, for the tables that need a file not every checkout
# has yet; a missing one leaves the table out of tables() and is named in MISSING (--check fails on a
# page that asks for it, saying which file to add).
MISSING = {}


def load_bench(backward=False):
    """{(stage, head_dim, causal, seq): result} of the forward runs, or of the backward runs."""
    runs = {}
    for b in json.loads(BENCH.read_text())["benchmarks"]:
        m = NAME.match(b["name"])
        if not m or "TFLOP/s" not in b or bool(m[5]) != backward:
            continue
        stage, name, d, causal, seq = int(m[1]), m[2], int(m[3]), m[4] == "1", int(m[6])
        runs[(stage, d, causal, seq)] = {"name": name, "tflops": b["TFLOP/s"], "ms": b["median_ms"],
                                         "gib": b.get("workspace_bytes", 0) / 2 ** 30}
    return runs


def geo_mean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def variant_slug(name):
    """A variant's name in lower case without spaces or punctuation, as value() takes it."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def ncu_csv_rows(path):
    """The metric rows of an `ncu --csv` file whose program printed its own lines first (the
    benchmark's): (launch ID, kernel, grid, metric, value), the value a float, None where ncu wrote n/a."""
    for row in csv.reader(path.read_text().splitlines()):
        if len(row) != 15 or row[0] == "ID":
            continue
        try:
            value = float(row[14].replace(",", ""))
        except ValueError:
            value = None
        yield row[0], row[4], row[8], row[12], value


def sanitizer_clean(stem, subject):
    """"N of M": how many lines of bench/results/STEM.txt that name `subject` report a clean run (exit
    status 0 and no error or hazard in the tool's summary)."""
    lines = [line for line in (RESULTS / f"{stem}.txt").read_text().splitlines() if subject in line]
    if not lines:
        raise KeyError(f"no line of {stem}.txt names {subject}")
    summaries = ("ERROR SUMMARY: 0 errors", "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")
    clean = [line for line in lines if "rc=0" in line and any(summary in line for summary in summaries)]
    return f"{len(clean)} of {len(lines)}"


def ctest_value(what, log="h100_ctest"):
    """A figure of a ctest log of bench/results (the full suite's, h100_ctest.log, unless log names another):
    passed, total, skipped, wall (ctest's "Total Test time (real)", whole seconds), or one test's status
    (Passed, Failed, Skipped, Timeout, ...) by its ctest name."""
    text = (RESULTS / f"{log}.log").read_text()
    if what == "wall":
        seconds = float(re.search(r"Total Test time \(real\) = +([0-9.]+) sec", text)[1])
        return f"{seconds:.0f}"
    results = dict(re.findall(r"Test\s+#\d+: (\S+) \.+\**\s*(Passed|Failed|Skipped|Not Run|Timeout)", text))
    if what == "total":
        return re.search(r"tests passed(?:, \d+ tests failed)? out of (\d+)", text)[1]
    if what == "passed":
        return str(sum(1 for s in results.values() if s == "Passed"))
    if what == "skipped":
        return str(sum(1 for s in results.values() if s in ("Skipped", "Not Run")))
    return results[what]


def not_measured_yet(path):
    """The text of a table whose results file is not committed yet."""
    return (f"Not measured yet: `scripts/device/gpu_check_decode.sh` writes `{path.relative_to(ROOT).as_posix()}` on the "
            "GPU machine; once it is committed, `python3 scripts/docs/make_tables.py --update` fills this table.")


def load_compare():
    """{(impl, direction, head_dim, causal, seq): tflops} of bench/compare.py's runs that succeeded."""
    out = {}
    for r in json.loads(COMPARE_JSON.read_text())["results"]:
        if r["status"] == "ok":
            out[(r["impl"], r["direction"], r["head_dim"], r["causal"], r["seq"])] = r["tflops"]
    return out


def load_anchors():
    """The quoted anchors: named ceilings and the table's cells, as the strings the quotation prints."""
    text = ANCHORS.read_text()
    found = {
        "bf16-matmul": re.search(r"bf16 matmul 8192\^3: ([\d.]+) TFLOP/s", text)[1],
        "fp32-matmul": re.search(r"fp32 matmul 8192\^3 \(no tf32\): ([\d.]+) TFLOP/s", text)[1],
        "copy": re.search(r"d2d copy 1GiB: ([\d.]+) TB/s", text)[1],
        "peak-bf16": re.search(r"bf16 dense ([\d.]+) TFLOP/s", text)[1],
        "peak-fp32": re.search(r"fp32 FFMA ([\d.]+) TFLOP/s", text)[1],
        "peak-tf32": re.search(r"TF32 ([\d.]+) TFLOP/s", text)[1],
        "hbm": re.search(r"HBM3 ([\d.]+) TB/s", text)[1],
    }
    head = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| dtype"):
            head = cells
        elif head and line.startswith("| ") and len(cells) == len(head):
            dtype, d, causal, b, h, n = cells[:6]
            for impl, cell in zip(head[6:], cells[6:]):
                for direction, part in zip(("forward", "backward"), cell.split(" / ")):
                    found[f"{dtype}/{impl}/{direction}/d{d}/c{int(causal == 'yes')}/{n}"] = part
    return found


# value:SPEC's first part -> the function that computes the figure; each page module registers its kinds.
VALUE_KINDS = {}


def value_kind(*kinds):
    def register(handler):
        for k in kinds:
            VALUE_KINDS[k] = handler
        return handler
    return register


def value(spec, runs=None, backward=None, compare=None, anchors=None):
    """One measured figure, as text. The forms of SPEC (c0/c1: causal off/on; seq: N):

      bench/SS/dD/cC/N/tflops|ms|peak|gib   stage SS's forward on the course grid (peak: % of fp32 peak;
                                        gib: its workspace in GiB, the benchmark's workspace_bytes)
      bwd/SS/dD/cC/N/tflops|done        stage SS's backward (done: the rate of the 7 products it really does)
      speedup/AA/BB/dD                  TFLOP/s of stage BB over stage AA at the course problem
      causal/SS/dD                      causal time over non-causal time, stage SS, course problem
      compare/IMPL/DIR/dD/cC/N          TFLOP/s of IMPL (stageNN, naive-torch, sdpa-...) in compare_h100.json
      compare-ratio/IMPL/STAGE/DIR/dD/cC/N   IMPL's TFLOP/s over the stage's
      ncu/dD/SS/METRIC                  a metric of h100_ncu_dD.csv (a key of NCU_ROWS, as the table shows it)
      ncu-ratio/dD/SS/METRIC/TT         that metric of stage SS over stage TT
      ncu-per/dD/SS/METRIC_A/METRIC_B   METRIC_A of stage SS over its METRIC_B
      anchor/NAME                       a ceiling of pytorch_anchors_h100.md (bf16-matmul, fp32-matmul,
                                        copy, peak-bf16, peak-fp32, peak-tf32, hbm)
      anchor/DTYPE/IMPL/DIR/dD/cC/N     a cell of its table, e.g. anchor/float32/naive-torch/forward/d64/c0/4096
      half/TAG/IMPL/dD/cC/N             forward TFLOP/s of IMPL in compare_h100_TAG.json (TAG: bf16, fp16)
      half-geo/TAG/IMPL[/BASE]          geometric mean over d, causal and N >= 1024 of IMPL's speed over
                                        BASE's (default sdpa-flash) in that file, e.g. half-geo/bf16/stage10
      half-min/TAG/IMPL[/BASE]          the lowest cell of the same
      half-max/TAG/IMPL[/BASE]          the highest cell of the same
      half-bwd/..., half-bwd-geo/..., half-bwd-min/..., half-bwd-max/...   the same four of the backward
                                        (stage11, stage11-det, sdpa-*), e.g. half-bwd-geo/bf16/stage11,
                                        half-bwd-geo/bf16/stage11-det/stage11 (the deterministic mode's
                                        speed over the default mode's)
        (in half-geo, half-min and the kinds below, TAG may be "both": the cells of bf16 and fp16
        together; and a fifth part dD keeps the cells of one head_dim, e.g. half-geo/both/stage12/sdpa-cudnn/d64)
      half-min-at/TAG/IMPL[/BASE], half-max-at/..., half-bwd-min-at/..., half-bwd-max-at/...   where the
                                        lowest (highest) cell is, in words (forward; backward)
                                        ("head_dim 64, causal, N = 1024"; the dtype first when TAG is both)
      half-below/TAG/IMPL[/BASE]        how many cells are below BASE as printed: "K of M"
      half-below-floor/TAG/IMPL[/BASE]  the same below the targets' floor, 0.9x as printed
      half-geo3/..., half-bwd-geo3/...  half-geo and half-bwd-geo to 3 decimals, where a target is met or
                                        missed by less than the 2-decimal figure shows
      ncu-tensor/dD/STAGE/WHAT         bank (shared-load conflicts), tensor (pipe %), short/long/barrier/wait
                                        (stalls per issue), occupancy (% of 64 warps), registers (per
                                        thread) of h100_ncu_tensor_dD_raw.csv
      ncu-raw/dD/SS/METRIC              that metric of h100_ncu_dD.csv as the profiler counted it (integer)
      ncu-pct/dD/SS/METRIC_A/METRIC_B   100 x METRIC_A over METRIC_B of stage SS, in percent (2 decimals)
      ncu-tflops/dD/SS/ffma|convention  TFLOP/s over the profiled kernel time: 2 x FFMA (the table's row), or
                                        the FlashAttention convention's 4·B·H·N²·d of the profiled problem
      ncu-warp-ffma/dD/SS               FFMA thread instructions / 32, in 10⁹ (warp-level FFMAs)
      ncu-loads-per-ffma/dD/SS          warp-level shared loads per warp-level FFMA
      ncu-warps-per-scheduler/dD/SS     achieved occupancy in warps per SM scheduler (64 warps, 4 schedulers)
      ffma-split/dD/SS/qk|rest|chained  stage 05's FFMA count taken apart (lesson 05): qk = the FFMAs of
                                        QK^T (three of every four of its multiply-adds), rest = the measured
                                        count less qk, chained = rest plus all of QK^T's multiply-adds
      bwd-split/dD/KERNEL/ms|share      a backward kernel's time (row_dot, dk_dv, dq) of h100_ncu_backward.csv,
                                        or its share of the backward in percent
      runner/SS/COLUMN                  a cell of h100_runner.txt (time_ms, tflops, err_vs_prev, err_vs_ref)
      runner-max/AA-BB/COLUMN           the largest err_vs_ref (or other number column) of stages AA..BB
      ptxas12/dD/cC/CONFIG/WHAT         the same of a stage 12 kernel: CONFIG in-order or pingpong-128 /
                                        pingpong-160 (the stage's), or a ladder rung's HopperConfig (e.g.
                                        2-128-2-0-0-0-0-1-0-0-0: two consumers, 128 keys, 2 stages, none
                                        of the pieces after them, one Q buffer), the largest over bf16 and fp16
      ptxas12-spilling                  how many of the stage's own kernels spill: "K of M"
      ptxas/SS/KERNEL/dD/WHAT           registers, stack, spill-stores, spill-loads of a kernel (e.g.
                                        online_softmax_attention_kernel, dk_dv_kernel) in ptxas_sm90.txt;
                                        of a kernel compiled for several tile sizes, the largest (the H100's)
      traffic-ms/SS/dD/PASSES           PASSES passes over stage SS's workspace at the course problem, in
                                        ms at the copy rate of pytorch_anchors_h100.md
      ratio/SPEC_A+SPEC_B               the figure SPEC_A over the figure SPEC_B (2 decimals)
      above/SPEC_A+SPEC_B               "above", "below" or "level with": how figure SPEC_A compares with
                                        SPEC_B as printed, for sentences that must stay true
      ncu-nonffma/dD/SS                 the share of warp instructions that are not FFMA, in percent
                                        (1 - FFMA thread instructions / 32 / smsp__inst_executed.sum)
      ncu-kernel/dD/SS/KERNEL/METRIC    a metric of one kernel of a stage profiled as several (stages 01,
                                        02: scores, softmax, pv; 07: row_dot, dk_dv, dq), or nonffma
      ablation/dD/cC/N/KEY/ms|tflops    a variant of h100_stage05_ablation.txt (KEY: s04, base, tiles, oneexp,
                                        warprows, regtile, shuffle, float4, transp, pad4, s05; s06, heavy,
                                        natural)
      ablation-gain/dD/KEY              what the rung KEY buys: the time of the rung before it over its own,
                                        stage 04 -> 05 at the course problem (2 decimals)
      ablation-total/dD/KEY             stage 04's time over rung KEY's
      ablation-top/dD/label|key|gain    the rung (tiles .. pad4) that gains most at head_dim D: its name in
                                        words, its key, its gain
      ablation-top/all/label            the same rung's name, said once where every head_dim agrees
                                        ("register tiles"), else each head_dim's ("X at d=64 and Y at d=128")
      ablation-order/dD/N               stage 06, causal: natural block order's time over heaviest-first's
      ablation-causal/dD/N              stage 06: causal time over non-causal time, measured back to back
      causal-predicted/N                the tile count's prediction of that ratio, 1/2 + 32/N (not measured)
      variant/dD/cC/N/SLUG/tflops|ms    a row of h100_stage10_variants.txt; SLUG is the variant's name in
                                        lower case without spaces or punctuation, e.g. stage10asbuilt,
                                        4wx32rx64kqsmem1blksmlazy
      variant12/TAG/dD/cC/N/SLUG/tflops|ms   a row of stage 12's variants (TAG: bf16, fp16) from the committed
                                        run that holds the whole block (VARIANTS12_FILES); SLUG as for variant,
                                        e.g. stage12asbuilt, a1consumerwarpgroupinorder, 2consumerwarpgroups,
                                        setmaxnregproducerwarpgroup, pingpong, intrawarpgroupoverlap,
                                        tmastoreofo, persistentblocks, querytilesinpairsheadbyhead,
                                        worktilesbacktoback
      variant12-step/TAG/dD/cC/N/SLUG   what the rung SLUG buys: the time of the rung before it (ladder A .. B)
                                        over its own
      variant12-total/TAG/dD/cC/N       version A's time over version B's
      variant12-after-b/TAG/dD/cC/N     version B's time over the registered kernel's (back to back)
      variant12-same/TAG/dD/cC/N        how far apart, in % of the smaller time, the two rows that time
                                        the registered kernel are ("stage 12 as built" and the last rung,
                                        VARIANTS12_AS_BUILT)
      variant12-same-max/all|dD         the largest of those over every complete block
      ncu12-l2/persistent|pairs/WHAT    the persistent kernel's profile without or with query tiles in
                                        pairs (NCU12_L2_FILES): time-us, dram-mb, l2-hit-pct, tensor-pct
                                        (means over the launches), launches
      ncu12/dD/WHAT                     stage 12's profile (h100_ncu_stage12_dD.csv, _tensor.csv), the mean over
                                        the launches: time-ms, tensor-pct, gmma-pct, gmma-inst, sm-pct, mem-pct,
                                        dram-pct, warps-pct, registers (NCU12_METRICS); tflops (FlashAttention
                                        FLOPs over the kernel time); wgmma-count (what the loops issue, to set
                                        beside gmma-inst); launches
      sanitizer/STEM/SUBJECT            "N of M": the lines of bench/results/STEM.txt naming SUBJECT that report
                                        a clean run, e.g. sanitizer/h100_sanitizer_stage11_12/stage12
      overhead/CASE/this|against|ratio  host µs per eager call in h100_python_overhead.json, the package with
                                        the custom operators (this) and before them (against), or this / against;
                                        CASE: decode-paged, decode, forward, attention; overhead/all/max-ratio:
                                        the largest ratio over the four
      ctest/passed|total|skipped|wall|TEST   the default suite's log, h100_ctest.log (TEST: a ctest name, its status)
      ctest-log/STEM/passed|total|...   the same of another ctest log, bench/results/STEM.log
      decode/PAGE/B/N/gbs|pct|us        stage 13's decode family in h100_bench_decode.json (PAGE 0: the
                                        contiguous cache, else the page size; pct: % of the HBM datasheet)
      decode-compare/B/N/IMPL/gbs|pct|us  a cell of compare_h100_decode.json (IMPL: stage13, stage13-paged,
                                        sdpa-flash; pct: % of the HBM datasheet)
      decode-compare/B/N/ratio          its last column: sdpa-flash's time over stage 13's (2 decimals)
      decode-versus/B/N                 "on par with", "faster than" or "slower than": stage 13 against
                                        sdpa-flash at (B, N), on par while the ratio, as printed, is within
                                        DECODE_PAR of 1 (for sentences that must stay true)
      decode-splits/B/N/S[/vsT]         stage13-splits at (B, N) with S splits: µs, or with /vsT its time over
                                        the time with T splits (h100_stage13_splits.txt)
      decode-target/SOURCE/min|max      the lowest or highest % of the HBM datasheet over the three target
                                        shapes (DECODE_TARGETS); SOURCE: bench (the contiguous cache of
                                        h100_bench_decode.json), paged (its paged cache), compare (stage13 in
                                        compare_h100_decode.json)
      ncu-stage/SS/dD/KERNEL/WHAT       one kernel's figure in h100_ncu_stageSS_dD.csv (+ _tensor.csv), first
                                        launch: WHAT is ms, registers, warps, sm, tensor, mem, dram (the
                                        columns of NCU_STAGE_COLUMNS), share (% of the call's time) or
                                        warps-per-sm; KERNEL is the name without _kernel (row_dot, dk_dv,
                                        convert_dq), or all with ms: the three kernels' sum
      training/TAG/WHAT                 the training run of h100_training_TAG.json (bf16), computed as
                                        tests/python/test_training.py does: worst (largest relative
                                        difference of window means, flash_stages vs sdpa_flash), spread
                                        (sdpa_math vs sdpa_flash), spread-times-factor, allowed (the test's
                                        tolerance), factor, floor (in %), steps, window, stage, or
                                        IMPL/first|last: the loss of the first or last step (IMPL:
                                        flash_stages, sdpa_flash, sdpa_math)
      rule-case/error|before|after      the stage 11 case that widened the half backward's rule, as
                                        h100_stage11_rule_case.txt records it: its dK max error, the bound before and after
                                        the stored-O term was added
      decode-met/SOURCE                 at how many of the three target shapes SOURCE reaches DECODE_GOAL
                                        of the datasheet: "all three", "two of the three", "one of the three"
                                        or "none of the three"
      stage14-summary/short|lesson      stage 14's backward in words from the compare runs (its speed over
                                        cuDNN, FlashAttention-2 and stage 11, the deterministic mode's over
                                        the default's), or "not measured yet" and what writes the cells
                                        while the runs hold no stage14 cells (tables/hopper_backward.py)
    """
    parts = spec.split("/")
    runs = runs if runs is not None else load_bench()
    handler = VALUE_KINDS.get(parts[0])
    figure = handler(spec, parts, parts[0], runs, backward, compare, anchors) if handler else None
    if figure is None:
        raise KeyError(spec)
    return figure

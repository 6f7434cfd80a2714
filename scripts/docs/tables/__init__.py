"""The tables and inline figures of the course's pages, made from bench/results/, one module per family of
pages: course (README.md and the course map), results_page (bench/compare.py's runs and the quoted anchors),
fp32_stages (lessons 01-07), tensor_stages (08-10), backward_tc (11), hopper (12), decoding (13),
hopper_backward (14); common
holds the results folder, the shared loaders and value(), the registry of inline figures.
scripts/docs/make_tables.py is the command line."""
import pathlib
import re

from .backward_tc import (backward_tc_table, ncu_stage_table, ptxas_stage11_table, stage11_2d_table,
                          stage11_bulk_table, stage11_order_table, stage11_p_variants_table, stage11_steps_table,
                          stage11_vs_fa2_table)
from .common import (DECODE_BENCH, FP32_PEAK_TFLOPS, MISSING, PAGES, RESULTS, ROOT, load_anchors, load_bench,
                     load_compare, value)
from .course import course_table, runner_table, stage_table
from .decoding import (decode_bench_table, decode_compare_table, decode_splits_table, load_decode_bench)
from .fp32_stages import (ABLATION, ablation_table, backward_split_table, ncu_kernels_table, ncu_path, ncu_table,
                          ptxas_backward_table, stage06_order_table)
from .hopper_backward import (ncu_stage14_table, stage14_compare_table, stage14_dq_order_table, stage14_head_dim32_table,
                              stage14_locked_clock_table,
                              stage14_power_table,
                              stage14_standing, stage14_timing_method_table, stage14_variants_table)
from .hopper import (ncu_stage12_table, stage12_after_b_table, stage12_compare_table, stage12_steps_table,
                     stage12_store_behind_table, stage12_tail_table, stage12_variants_table, stage12_wide_keys_table)
from .results_page import compare_half_table, compare_table
from .tensor_stages import ncu_tensor_table, variants_table

__all__ = ["DECODE_BENCH", "PAGES", "ROOT", "Values", "check", "load_bench", "load_decode_bench", "tables",
           "update", "value"]


def tables():
    """{table name: Markdown} of every table the committed results can make."""
    runs = load_bench()
    out = {"course": course_table(runs), "runner": runner_table(), "compare": compare_table(),
           "backward-split": backward_split_table(), "compare-bf16": compare_half_table("bf16"),
           "compare-fp16": compare_half_table("fp16"),
           "stage10-variants": variants_table(), "ptxas-backward": ptxas_backward_table(),
           "ptxas-stage11": ptxas_stage11_table(),
           "decode-bench": decode_bench_table(), "decode-compare": decode_compare_table(),
           "decode-splits-1-131072": decode_splits_table(1, 131072),
           "decode-splits-8-32768": decode_splits_table(8, 32768),
           "stage11-backward-bf16": backward_tc_table("bf16"), "stage11-backward-fp16": backward_tc_table("fp16"),
           "stage11-steps": stage11_steps_table(), "stage11-2d": stage11_2d_table(),
           "stage11-order": stage11_order_table(), "stage11-p-variants": stage11_p_variants_table(),
           "stage11-bulk": stage11_bulk_table(),
           "stage11-vs-fa2": stage11_vs_fa2_table(),
           # Stage 14's: a line that says "not measured yet" until the compare runs and the profile hold it.
           "stage14-standing": stage14_standing(), "stage14-compare": stage14_compare_table(),
           "ncu-stage14": ncu_stage14_table(), "stage14-variants": stage14_variants_table(),
           "stage14-power": stage14_power_table(), "stage14-timing-method": stage14_timing_method_table(),
           "stage14-locked-clock": stage14_locked_clock_table(),
           "stage14-dq-order": stage14_dq_order_table(),
           "stage14-head-dim32": stage14_head_dim32_table()}
    if all((RESULTS / f"h100_ncu_stage11_d{d}{s}.csv").exists() for d in (64, 128) for s in ("", "_tensor")):
        out["ncu-stage11"] = ncu_stage_table(11)
    else:
        MISSING["ncu-stage11"] = "h100_ncu_stage11_d64.csv, _d128.csv and their _tensor.csv (its command in bench/results/MANIFEST.md)"
    # A checkout without one of stage 12's files gets the table's name in MISSING, which --check reports
    # with the file, as for the ablation.
    stage12 = {"stage12-variants-d64": lambda: stage12_variants_table(64),
               "stage12-variants-d128": lambda: stage12_variants_table(128),
               "stage12-steps": stage12_steps_table, "stage12-after-b": stage12_after_b_table,
               "ncu-stage12": ncu_stage12_table,
               "stage12-compare": stage12_compare_table, "stage12-store-behind": stage12_store_behind_table,
               "stage12-wide-keys": stage12_wide_keys_table, "stage12-tail": stage12_tail_table}
    for name, make in stage12.items():
        try:
            out[name] = make()
        except FileNotFoundError as e:
            MISSING[name] = f"{pathlib.Path(e.filename).name} (scripts/device/gpu_check_hopper.sh, bench/results/MANIFEST.md)"
    for d in (64, 128):
        if (RESULTS / f"h100_ncu_tensor_d{d}_raw.csv").exists():
            out[f"ncu-tensor-d{d}"] = ncu_tensor_table(d)
    for d in (64, 128):
        out[f"ncu-d{d}"] = ncu_table(d, runs)
        try:
            out[f"ncu-kernels-d{d}"] = ncu_kernels_table(d)
        except KeyError:
            MISSING[f"ncu-kernels-d{d}"] = f"stages 01, 02 and 07 in {ncu_path(d).name} (scripts/profile/profile_stages.sh {d})"
    if ABLATION.exists():
        out["stage05-ablation"] = ablation_table()
        out["stage06-order"] = stage06_order_table()
    else:
        for name in ("stage05-ablation", "stage06-order"):
            MISSING[name] = f"{ABLATION.name} (scripts/device/gpu_check_ablation.sh)"
    for stage in sorted({k[0] for k in runs}):
        out[f"stage-{stage:02d}"] = stage_table(runs, stage)
    backward = load_bench(backward=True)
    out["backward"] = "\n\n".join(
        stage_table(backward, stage, "Backward TFLOP/s (2.5x the forward FLOPs), stage " + f"{stage:02d}")
        for stage in sorted({k[0] for k in backward}))
    return out


VALUE = re.compile(r"<!-- value:([\w./+-]+) -->(.*?)<!-- /value -->", re.S)


class Values(dict):
    """Every figure a page asks for, computed on first use from files loaded once."""

    def __init__(self):
        super().__init__()
        self.sources = {"runs": load_bench(), "backward": load_bench(backward=True), "compare": load_compare(),
                        "anchors": load_anchors()}
        if float(self.sources["anchors"]["peak-fp32"]) != FP32_PEAK_TFLOPS:
            raise SystemExit("FP32_PEAK_TFLOPS differs from bench/results/pytorch_anchors_h100.md")

    def __missing__(self, spec):
        try:
            self[spec] = value(spec, **self.sources)
        except FileNotFoundError as e:
            raise SystemExit(f"no measured figure for value:{spec}: bench/results/{pathlib.Path(e.filename).name} "
                             f"does not exist yet (scripts/device/gpu_check_ablation.sh and the profile scripts write it)")
        except (KeyError, IndexError, ValueError) as e:
            raise SystemExit(f"no measured figure for value:{spec} ({e!r})")
        return self[spec]


def fill(text, all_tables, values, where):
    """text with every table region and inline figure regenerated."""
    def table(m):
        name = m[1]
        if name in MISSING:
            raise SystemExit(f"{where}: table {name} needs {MISSING[name]}, which bench/results/ does not have yet")
        if name not in all_tables:
            raise SystemExit(f"{where}: no table named {name}")
        return f"<!-- table:{name} -->\n{all_tables[name]}\n<!-- /table:{name} -->"

    text = re.sub(r"<!-- table:([\w-]+) -->.*?<!-- /table:\1 -->", table, text, flags=re.S)
    return VALUE.sub(lambda m: f"<!-- value:{m[1]} -->{values[m[1]]}<!-- /value -->", text)


def stale_regions(old, new):
    """Names of the regions of old that fill() changed."""
    names = []
    olds = re.findall(r"<!-- (table:[\w-]+|value:[\w./+-]+) -->(.*?)<!-- /", old, flags=re.S)
    news = re.findall(r"<!-- (table:[\w-]+|value:[\w./+-]+) -->(.*?)<!-- /", new, flags=re.S)
    for (name, a), (_, b) in zip(olds, news):
        if a != b:
            names.append(f"{name} (has {a.strip()[:40]!r}, measured {b.strip()[:40]!r})" if name.startswith("value")
                         else name)
    return names


def update(path, all_tables, values):
    text = path.read_text()
    new = fill(text, all_tables, values, path)
    if new != text:
        path.write_text(new)
        print(f"updated {path}")


def check(paths, all_tables, values):
    """1 if any generated region of paths is out of date (the CPU test), else 0."""
    stale = 0
    for path in paths:
        text = path.read_text()
        try:
            new = fill(text, all_tables, values, path)
        except SystemExit as e:  # a figure with no source: stale, and say which
            stale += 1
            where = str(path.relative_to(ROOT) if path.is_absolute() else path)
            print(str(e).replace(str(path), where) if str(path) in str(e) else f"{where}: {e}")
            continue
        if new != text:
            stale += 1
            for name in stale_regions(text, new) or ["a generated region"]:
                print(f"{path.relative_to(ROOT) if path.is_absolute() else path}: out of date: {name}")
    n = len(paths)
    if stale:
        print(f"make_tables --check: {stale} of {n} files out of date; "
              f"run python3 scripts/docs/make_tables.py --update {' '.join(PAGES)}")
        return 1
    print(f"make_tables --check: {n} files, every table and inline figure matches bench/results/")
    return 0

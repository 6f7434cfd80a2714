#!/usr/bin/env python3
"""Draws the loss curves of the bf16 training test in one plot (lesson 11).

tests/python/test_training.py trains one small causal transformer three times from the same weights on
the same batches, under bf16 autocast: with flash_stages.attention (stage 10's forward, stage 11's
backward), with SDPA's flash backend (FlashAttention-2, the reference) and with SDPA's math backend
(the spread that bf16 rounding alone causes). With FLASH_TRAINING_OUT set it writes the three curves
as JSON; bench/results/h100_training_bf16.json is that file from the H100 run (its command: bench/results/MANIFEST.md).

    python3 scripts/docs/plot_training.py [--json bench/results/h100_training_bf16.json] [--out FILE.png]

writes FILE.png (default: the JSON's name with .png), 850 pixels wide so that it fits the lesson's page
on the site, with two panels:
  top     the loss of every step, log scale: flash_stages and SDPA flash solid, SDPA math dashed
  bottom  what the test compares: the relative difference of the means over windows of `window` steps,
          against SDPA flash, of flash_stages and of SDPA math, with the test's two limits (its factor
          times SDPA math's largest difference, and its floor; the larger of the two is the tolerance)
The test's constants (BF16_SPREAD_FACTOR, BF16_FLOOR) are read from the test file, so the plot cannot
drift from it. The output holds no date or version (PNG metadata off), so the same JSON and the same
matplotlib give the same bytes.
"""
import argparse
import json
import pathlib
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEST = ROOT / "tests/python/test_training.py"
CURVES = {  # JSON key -> (label, line style, colour)
    "flash_stages": ("flash_stages (stage 10 fwd, stage 11 bwd)", "-", "tab:blue"),
    "sdpa_flash": ("SDPA flash (FlashAttention-2), the reference", "-", "tab:orange"),
    "sdpa_math": ("SDPA math (another bf16 attention)", "--", "dimgray"),
}


def test_constant(name):
    return float(re.search(rf"^{name} = ([\d.]+)", TEST.read_text(), re.M)[1])


def window_means(losses, window):
    """The means the test compares: losses[0:window], losses[window:2 window], ..."""
    return [sum(losses[i:i + window]) / window for i in range(0, len(losses), window)]


def relative_differences(curve, reference, window):
    return [abs(x - y) / abs(y) for x, y in zip(window_means(curve, window), window_means(reference, window))]


def plot(run, out):
    losses, window = run["losses"], run["window"]
    steps = range(1, len(losses["flash_stages"]) + 1)
    fig, (left, right) = plt.subplots(2, 1, figsize=(8.5, 8.5))

    for key, (label, style, color) in CURVES.items():
        left.plot(steps, losses[key], style, color=color, label=label, linewidth=1.2)
    left.set_yscale("log")
    left.set_xlabel("training step")
    left.set_ylabel("cross-entropy loss")
    left.set_title(f"loss of each step, bf16 autocast, {run['steps']} steps")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)

    factor, floor = test_constant("BF16_SPREAD_FACTOR"), test_constant("BF16_FLOOR")
    centres = [w * window + window / 2 for w in range(len(window_means(losses["sdpa_flash"], window)))]
    spread = relative_differences(losses["sdpa_math"], losses["sdpa_flash"], window)
    for key in ("flash_stages", "sdpa_math"):
        label, style, color = CURVES[key]
        right.plot(centres, relative_differences(losses[key], losses["sdpa_flash"], window), style + "o",
                   color=color, markersize=4, label=label.split(" (")[0] + " vs SDPA flash")
    right.axhline(factor * max(spread), color="tab:red", linestyle=":",
                  label=f"{factor:g} x the largest SDPA math difference")
    right.axhline(floor, color="tab:red", linestyle="-", linewidth=0.8, label=f"floor {100 * floor:g}%")
    right.set_yscale("log")
    right.set_ylim(top=10)  # room for the legend above the floor
    right.set_xlabel(f"step (centre of each {window}-step window)")
    right.set_ylabel("relative difference of the window means")
    right.set_title("what the test compares (tolerance: the larger red line)")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)

    fig.suptitle(f"Two-layer causal transformer, stage {run['stage']} backward against SDPA\n"
                 f"(tests/python/test_training.py)")
    fig.tight_layout()
    fig.savefig(out, dpi=100, metadata={"Software": None})
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=pathlib.Path, default=ROOT / "bench/results/h100_training_bf16.json")
    parser.add_argument("--out", type=pathlib.Path, help="the PNG to write (default: the JSON's name, .png)")
    args = parser.parse_args()
    out = args.out or args.json.with_suffix(".png")
    plot(json.loads(args.json.read_text()), out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

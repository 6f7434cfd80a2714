#!/usr/bin/env python3
"""Host time per eager call of flash_stages on tiny inputs, where the GPU work is a few microseconds
and the time per call is the Python, the checks, the allocation and the launch: many calls in a row,
one synchronize at the end, time.perf_counter around them; the median of several trials. PyTorch's
SDPA on the same inputs is the yardstick.

    PYTHONPATH=<build>/python python3 tests/python/overhead.py [--calls=2000] [--trials=7] [--json FILE]
    PYTHONPATH=<build>/python python3 tests/python/overhead.py --against DIR [--trials=41] [--json FILE]

It measures whatever flash_stages is on the path: the package with PyTorch custom operators, where it
also times the operators called straight (torch.ops.flash_stages.*) and the wrappers with every call
routed through them, or a package without them (those rows are then left out). Not a test: pytest
does not collect it (its name does not start with test_).

--against DIR compares two versions of the package in one process: DIR is another flash_stages package
folder (its .py files and a libflash_stages_c.so it can load), imported under the name
flash_stages_against. For each case the two versions' trials alternate, so that both see the same
machine, clocks and allocator state; the medians over trials and the ratio are printed.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flash_stages


def per_call_us(fn, calls, trials):
    for _ in range(20):  # warm-up: the library's load, the stage table, the allocator's blocks
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times), min(times)


def operators():
    """torch.ops.flash_stages where this package registers operators, else None."""
    try:
        ops = torch.ops.flash_stages
        ops.forward  # noqa: B018 (the lookup raises where there is no such operator)
        return ops
    except (AttributeError, RuntimeError):
        return None


def cases(package=flash_stages):
    dev, bf16 = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=dev).to(bf16)

    # Decoding: 1 new token, 8 query heads over 2 K/V heads, a cache of 256 keys (contiguous and paged).
    q1, k, v = randn(1, 8, 1, 128), randn(1, 2, 256, 128), randn(1, 2, 256, 128)
    k_pages, v_pages = randn(16, 16, 2, 128), randn(16, 16, 2, 128)
    table = torch.arange(16, dtype=torch.int32, device=dev).view(1, 16)
    lens = torch.tensor([256], dtype=torch.int32, device=dev)
    # A tiny prefill: 64 queries and keys, one head.
    qp, kp, vp = randn(1, 1, 64, 64), randn(1, 1, 64, 64), randn(1, 1, 64, 64)
    k_rep, v_rep = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)

    rows = [
        ("flash_stages.forward, stage 13, decode 1x256", lambda: package.forward(q1, k, v, stage=13)),
        ("flash_stages.decode_paged, 1x256 in 16 pages", lambda: package.decode_paged(q1, k_pages, v_pages, table,
                                                                                           lens)),
        ("flash_stages.forward, stage 10, 64x64", lambda: package.forward(qp, kp, vp, stage=10)),
        ("flash_stages.attention, no grad, 64x64", lambda: package.attention(qp, kp, vp)),
        ("SDPA, decode 1x256 (K/V heads repeated)", lambda: F.scaled_dot_product_attention(q1, k_rep, v_rep)),
        ("SDPA, 64x64", lambda: F.scaled_dot_product_attention(qp, kp, vp)),
    ]
    ops = operators()
    if ops is not None:
        rows += [
            ("torch.ops.flash_stages.forward, stage 13", lambda: ops.forward(q1, k, v, 13, False, None)),
            ("torch.ops.flash_stages.decode_paged", lambda: ops.decode_paged(q1, k_pages, v_pages, table, lens, None,
                                                                            False, None)),
            ("torch.ops.flash_stages.forward, stage 10", lambda: ops.forward(qp, kp, vp, 10, False, None)),
        ]
    return rows


def load_package(folder):
    """The flash_stages package in `folder`, imported as flash_stages_against (its imports are relative)."""
    init = os.path.join(folder, "__init__.py")
    spec = importlib.util.spec_from_file_location("flash_stages_against", init, submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compare(folder, calls, trials):
    """Per flash_stages case, this package and the one in `folder`, trial by trial in turn."""
    other = load_package(folder)
    results = []
    for (name, fn), (_, other_fn) in zip(cases()[:4], cases(other)[:4]):
        times = {"this": [], "against": []}
        for f in (fn, other_fn):
            per_call_us(f, calls, 1)  # warm-up for both before either is timed
        for _ in range(trials):
            for key, f in (("this", fn), ("against", other_fn)):
                start = time.perf_counter()
                for _ in range(calls):
                    f()
                torch.cuda.synchronize()
                times[key].append((time.perf_counter() - start) / calls * 1e6)
        this, against = statistics.median(times["this"]), statistics.median(times["against"])
        results.append({"case": name, "this_median_us": this, "against_median_us": against,
                        "this_over_against": this / against, "this_min_us": min(times["this"]),
                        "against_min_us": min(times["against"])})
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per trial")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--against", metavar="DIR", help="another flash_stages package folder to alternate with")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("overhead.py: no CUDA device", file=sys.stderr)
        return 1
    device = torch.cuda.get_device_name()

    if args.against:
        results = compare(args.against, args.calls, args.trials)
        print(f"host time per call, this package ({os.path.dirname(flash_stages.__file__)}) and "
              f"{args.against} alternated, {args.calls} calls x {args.trials} trials each, torch {torch.__version__}, "
              f"{device}")
        width = max(len(r["case"]) for r in results)
        print(f"{'case':<{width}}  this (median us)  against (median us)  this / against")
        for r in results:
            print(f"{r['case']:<{width}}  {r['this_median_us']:16.2f}  {r['against_median_us']:19.2f}  "
                  f"{r['this_over_against']:14.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": device, "torch": torch.__version__, "calls": args.calls, "trials": args.trials,
                           "against": args.against, "results": results}, f, indent=1)
        return 0

    from flash_stages import _api
    has_direct = hasattr(_api, "DIRECT_EAGER")
    results = []
    for name, fn in cases():
        median, best = per_call_us(fn, args.calls, args.trials)
        results.append({"case": name, "median_us": median, "min_us": best})
    if has_direct:  # the same wrappers with every call through the dispatcher
        _api.DIRECT_EAGER = False
        for name, fn in cases()[:4]:
            median, best = per_call_us(fn, args.calls, args.trials)
            results.append({"case": name + " [via torch.ops]", "median_us": median, "min_us": best})
        _api.DIRECT_EAGER = True

    print(f"host time per call, {args.calls} calls x {args.trials} trials, torch {torch.__version__}, {device}")
    width = max(len(r["case"]) for r in results)
    print(f"{'case':<{width}}  median us  min us")
    for r in results:
        print(f"{r['case']:<{width}}  {r['median_us']:9.2f}  {r['min_us']:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "torch": torch.__version__, "calls": args.calls, "trials": args.trials,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Host time per eager call of flash_stages on tiny inputs, where the GPU work is a few microseconds
and the time per call is the Python, the checks, the allocation and the launch: many calls in a row,
one synchronize at the end, time.perf_counter around them; the median of several trials. PyTorch's
SDPA on the same inputs is the yardstick.

    PYTHONPATH=<build>/python python3 tests/python/overhead.py [--calls=2000] [--trials=7] [--json FILE]

It measures whatever flash_stages is on the path: the package with PyTorch custom operators, where it
also times the operators called straight (torch.ops.flash_stages.*) and the wrappers with every call
routed through them, or a package without them (those rows are then left out). Not a test: pytest
does not collect it (its name does not start with test_).
"""

import argparse
import json
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


def cases():
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
        ("flash_stages.forward, stage 13, decode 1x256", lambda: flash_stages.forward(q1, k, v, stage=13)),
        ("flash_stages.decode_paged, 1x256 in 16 pages", lambda: flash_stages.decode_paged(q1, k_pages, v_pages, table,
                                                                                           lens)),
        ("flash_stages.forward, stage 10, 64x64", lambda: flash_stages.forward(qp, kp, vp, stage=10)),
        ("flash_stages.attention, no grad, 64x64", lambda: flash_stages.attention(qp, kp, vp)),
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per trial")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("overhead.py: no CUDA device", file=sys.stderr)
        return 1

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

    device = torch.cuda.get_device_name()
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

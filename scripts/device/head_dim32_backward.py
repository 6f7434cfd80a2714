#!/usr/bin/env python3
"""Stage 14's backward at head_dim 32, which runs on head_dim 64's tiles (lesson 14), beside stage 11,
cuDNN's backward (SDPA pinned to cuDNN) and FlashAttention-2's (SDPA's flash backend), and beside stage
14 at head_dim 64 on the same tokens: bf16, B·N = 16384, H·d = 2048 (64 heads at head_dim 32, 32 at
64), N 4096 and 16384, causal and not. Per cell, each implementation's backward alone (stages 11 and
14 from the forward's o and lse, SDPA's by autograd from a kept graph) is warmed up, then timed by CUDA
events in ROUNDS interleaved rounds of CALLS calls, the order rotated each round; the median call is
reported, in TFLOP/s by the FlashAttention convention (2.5 x 4·B·H·N²·d, causal half).

    PYTHONPATH=build/python python3 scripts/device/head_dim32_backward.py > h100_backward_head_dim32.txt
"""
import statistics

ROUNDS, CALLS = 4, 5
TOKENS, HIDDEN = 16384, 2048


def main():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flash_stages

    backends = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}
    print("# Stage 14's backward at head_dim 32 (on head_dim 64's tiles) beside stage 11, cuDNN's and "
          "FlashAttention-2's\n# (SDPA pinned to its cuDNN and flash backends), and stage 14 at head_dim 64 on the "
          f"same tokens: bf16,\n# B*N = {TOKENS}, H*d = {HIDDEN}, each backward alone, {ROUNDS} interleaved rounds "
          f"of {CALLS} calls, median\n# (scripts/device/head_dim32_backward.py, whose docstring says how). Per line: "
          "head_dim of the cell, N, causal;\n# then per implementation \"dD name: median ms, TFLOP/s\" "
          f"(FlashAttention convention).\n# {torch.cuda.get_device_name()}, torch {torch.__version__}.")
    for n in (4096, 16384):
        for causal in (False, True):
            row = {}
            for d in (32, 64):
                batch, heads = TOKENS // n, HIDDEN // d
                g = torch.Generator(device="cuda").manual_seed(n + d + int(causal))
                q, k, v, do = [torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                               for _ in range(4)]
                o, lse = flash_stages.forward(q, k, v, causal=causal, stage=14)
                calls = {}
                for stage in ((14, 11) if d == 32 else (14,)):
                    calls[f"stage{stage}"] = (lambda s=stage: flash_stages.backward(q, k, v, o, lse, do,
                                                                                    causal=causal, stage=s))
                if d == 32:
                    for name, backend in backends.items():
                        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                        with sdpa_kernel(backend):
                            out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
                        calls[name] = (lambda out=out, leaves=leaves, backend=backend:
                                       _grad(torch, sdpa_kernel, backend, out, leaves, do))
                flops = 2.5 * 4.0 * batch * heads * n * n * d / (2 if causal else 1)
                for name, fn in list(calls.items()):
                    try:
                        for _ in range(3):
                            fn()
                        torch.cuda.synchronize()
                    except RuntimeError as e:  # a backend that refuses the shape: left out, with why
                        print(f"# d{d} N{n} causal{int(causal)} {name}: {str(e).splitlines()[0][:160]}")
                        del calls[name]
                times = {name: [] for name in calls}
                names = list(calls)
                for r in range(ROUNDS):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                                  for _ in range(CALLS)]
                        for a, b in events:
                            a.record()
                            calls[name]()
                            b.record()
                        torch.cuda.synchronize()
                        times[name] += [a.elapsed_time(b) for a, b in events]
                for name in names:
                    ms = statistics.median(times[name])
                    row[f"d{d} {name}"] = (ms, flops / (ms * 1e-3) / 1e12)
                del q, k, v, do, o, lse, calls
                torch.cuda.empty_cache()
            cells = " | ".join(f"{name}: {ms:.3f} ms, {tf:.1f} TFLOP/s" for name, (ms, tf) in row.items())
            print(f"32 {n} {int(causal)} | {cells}", flush=True)


def _grad(torch, sdpa_kernel, backend, out, leaves, do):
    with sdpa_kernel(backend):
        return torch.autograd.grad(out, leaves, do, retain_graph=True)


if __name__ == "__main__":
    main()

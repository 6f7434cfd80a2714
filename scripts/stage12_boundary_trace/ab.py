# Times builds of driver.cu against each other (scripts/stage12_boundary_trace): R rounds, the order rotated each
# round; per cell the median of each binary's per-round medians (a round: 40 launches, their median) and its
# ratio to the first binary's; then the checksums of O and lse each binary printed (one per binary when the
# runs agree with themselves; the same across binaries when a change keeps the arithmetic).
#   python3 ab.py BIN1,BIN2,... BxHxNxDxCAUSAL,... [R]
import re, subprocess, sys, statistics
bins = sys.argv[1].split(",")
cells = [c.split("x") for c in sys.argv[2].split(",")]  # BxHxNxDxcausal
R = int(sys.argv[3]) if len(sys.argv) > 3 else 5
for cell in cells:
    res = {b: [] for b in bins}
    sums = {}
    for r in range(R):
        order = bins[r % len(bins):] + bins[:r % len(bins)]
        for b in order:
            out = subprocess.run([b] + cell, capture_output=True, text=True, timeout=60).stdout
            m = re.search(r"median ([0-9.]+) ms", out)
            c = re.search(r"checksum (.*)", out)
            sums.setdefault(b, set()).add(c.group(1) if c else "none")
            res[b].append(float(m.group(1)) if m else float("nan"))
    base = statistics.median(res[bins[0]])
    line = " ".join(cell) + ": " + "  ".join(
        f"{b.split('/')[-1]} {statistics.median(v):.4f} ({base / statistics.median(v):.3f}x; {min(v):.4f}-{max(v):.4f})"
        for b, v in res.items())
    print(line, flush=True)
    print("   checksums: " + "  ".join(f"{b.split('/')[-1]} {sorted(v)}" for b, v in sums.items()), flush=True)

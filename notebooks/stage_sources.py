"""What the notebooks read from the repository: the stages' tile sizes, from their kernel sources.

The sizes are never typed into a notebook, so the pictures and counts follow the kernels if they
change. Used by 02_tiling.ipynb and 03_benchmark_results.ipynb.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
STAGES = {int(p.name[:2]): p for p in sorted((ROOT / "stages").glob("[0-9][0-9]_*")) if p.is_dir()}


def constants(path):
    """The `constexpr int NAME = EXPR;` of a source file whose value is a plain integer expression."""
    values = {}
    for name, expr in re.findall(r"constexpr int (\w+) = ([^;]+);", path.read_text()):
        if name not in values and re.fullmatch(r"[\w\s*/+()-]+", expr):
            try:
                values[name] = int(eval(expr, {"__builtins__": {}}, dict(values)))
            except (NameError, SyntaxError, TypeError):
                pass  # depends on a template parameter such as kHeadDim
    return values


def tile_sizes(stage, head_dim):
    """(Br, Bc): query rows per block and keys per K/V tile of a tiled stage, from its kernel source.
    Stages 04-07 take smaller K/V tiles where a GPU allows a block less shared memory than an H100;
    these are the H100's, the tiles the measurements are of."""
    src = next(STAGES[stage].glob("*.cu"))
    c = constants(src)
    if "kBlockRows" not in c:
        raise RuntimeError(f"{src} defines no kBlockRows: not a tiled stage, or the source changed")
    if "kBlockCols" in c:
        return c["kBlockRows"], c["kBlockCols"]
    if "kPreferredBlockCols" in c:
        return c["kBlockRows"], c["kPreferredBlockCols"]
    m = re.search(r"return kHeadDim <= (\d+) \? (\d+) : (\d+);", src.read_text())
    if not m:
        raise RuntimeError(f"cannot find the K/V tile size (Bc) in {src}")
    return c["kBlockRows"], int(m[2]) if head_dim <= int(m[1]) else int(m[3])

"""The C library (flash_stages_c.h) through ctypes, and the stage table it reports.

Nothing here imports torch: `import flash_stages` and `flash_stages.stages()` work without it.
The library is loaded on first use, not at import, so that the package imports even where it
has not been built (and says so, with the fix, when it is first needed).
"""

import ctypes
import dataclasses
import functools
import operator
import os
import sys
import threading

__all__ = [
    "ABI_VERSION",
    "Stage",
    "StageError",
    "library_path",
    "stages",
    "get_stage",
    "stage_number",
    "paged_workspace_bytes",
]

# Must equal FLASH_STAGES_C_ABI_VERSION in flash_stages_c.h.
ABI_VERSION = 5

# Status codes of flash_stages_c.h (the values of flash::StatusCode).
SUCCESS = 0
NULL_POINTER = 1
INVALID_DIMENSION = 2
INVALID_ARGUMENT = 3
HEAD_DIM_NOT_SUPPORTED = 4
HEADS_NOT_DIVISIBLE = 5
MISALIGNED_POINTER = 6
NOT_SUPPORTED = 7
WORKSPACE_TOO_SMALL = 8
CUDA_ERROR = 9
DTYPE_NOT_SUPPORTED = 10
ARCH_NOT_SUPPORTED = 11
SHARED_MEMORY_TOO_SMALL = 12
INTERNAL_ERROR = -1

# Codes that are not the caller's argument's fault: they raise RuntimeError, the rest ValueError.
_RUNTIME_CODES = (CUDA_ERROR, INTERNAL_ERROR, WORKSPACE_TOO_SMALL, ARCH_NOT_SUPPORTED, SHARED_MEMORY_TOO_SMALL)

# flash_stages_forward's dtype argument (flash::DType), by torch's name of the type.
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}

_MESSAGE_BYTES = 1024
_MAX_HEAD_DIMS = 64

_LIBRARY_NAMES = {
    "linux": "libflash_stages_c.so",
    "darwin": "libflash_stages_c.dylib",
    "win32": "flash_stages_c.dll",
}

# The registry's dtype spellings and the names torch gives the same types.
DTYPE_NAMES = {
    "fp32": "float32",
    "float32": "float32",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp64": "float64",
    "float64": "float64",
}


class StageError(RuntimeError):
    """The C library is missing, of another ABI version, or failed to load."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of the course, as the C library's registry reports it."""

    number: int
    folder: str
    name: str
    lesson: str
    dtypes: tuple  # the registry's spelling, e.g. ("fp32",)
    head_dims: tuple
    causal: bool  # accepts causal=True
    backward: bool  # has a backward
    max_seq_q: int = 0  # the most query rows per head it takes; 0: any (16 for the decoding stage)
    paged: bool = False  # has a paged-cache entry point (flash_stages.decode_paged)
    # its backward sums with atomics unless asked to be deterministic (stage 11's dQ): the default mode
    # may differ in the last bits between two runs on the same inputs
    backward_atomic: bool = False

    @property
    def torch_dtype_names(self):
        """The dtypes as torch names them ("float32", ...)."""
        return tuple(DTYPE_NAMES.get(d, d) for d in self.dtypes)

    def supports(self, *, dtype=None, head_dim=None, causal=False, backward=False, seq_q=None, paged=False):
        """True when this stage accepts a problem of this dtype (torch dtype or name), head_dim, causality and
        number of query rows (seq_q), with a backward or a paged cache where asked."""
        if seq_q is not None and self.max_seq_q and seq_q > self.max_seq_q:
            return False
        if paged and not self.paged:
            return False
        if dtype is not None:
            name = str(dtype).replace("torch.", "")
            if DTYPE_NAMES.get(name, name) not in self.torch_dtype_names:
                return False
        if head_dim is not None and head_dim not in self.head_dims:
            return False
        if causal and not self.causal:
            return False
        if backward and not self.backward:
            return False
        return True

    def __str__(self):
        return f"stage {self.number:02d} ({self.name})"


def library_path():
    """Where the C library is looked for: $FLASH_STAGES_LIBRARY, else next to this file."""
    override = os.environ.get("FLASH_STAGES_LIBRARY")
    if override:
        return override
    name = _LIBRARY_NAMES.get(sys.platform, "libflash_stages_c.so")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


_lock = threading.Lock()
_lib = None
_stages = None
_by_number = {}  # get_stage's look-up, filled as stages are asked for


def _declare(lib):
    c_int, c_float, c_size_t, c_void_p = ctypes.c_int, ctypes.c_float, ctypes.c_size_t, ctypes.c_void_p
    c_char_pp = ctypes.POINTER(ctypes.c_char_p)
    c_int_p = ctypes.POINTER(c_int)
    msg = [ctypes.c_char_p, c_size_t]
    dims = [c_int] * 6  # batch, heads_q, heads_kv, seq_q, seq_kv, head_dim

    lib.flash_stages_abi_version.argtypes = []
    lib.flash_stages_abi_version.restype = c_int
    lib.flash_stages_status_name.argtypes = [c_int]
    lib.flash_stages_status_name.restype = ctypes.c_char_p
    lib.flash_stages_count.argtypes = []
    lib.flash_stages_count.restype = c_int
    lib.flash_stages_info.argtypes = [c_int, c_int_p, c_char_pp, c_char_pp, c_char_pp, c_char_pp, c_int_p, c_int_p,
                                      c_int_p, c_int, c_int_p]
    lib.flash_stages_info.restype = c_int
    for fn in (lib.flash_stages_forward_workspace_size, lib.flash_stages_backward_workspace_size):
        fn.argtypes = [c_int] + dims + [ctypes.POINTER(c_size_t)] + msg
        fn.restype = c_int
    lib.flash_stages_forward.argtypes = ([c_int] + [c_void_p] * 5 + dims + [c_float, c_int, c_int, c_void_p, c_size_t, c_int,
                                                                          c_void_p] + msg)
    lib.flash_stages_forward.restype = c_int
    # stage; q, k, v, o, lse, do, dq, dk, dv; dims; scale, causal, dtype, deterministic, workspace,
    # workspace_bytes, device, stream
    lib.flash_stages_backward.argtypes = ([c_int] + [c_void_p] * 9 + dims + [c_float, c_int, c_int, c_int, c_void_p,
                                                                           c_size_t, c_int, c_void_p] + msg)
    lib.flash_stages_backward.restype = c_int
    lib.flash_stages_limits.argtypes = [c_int, c_int_p, c_int_p, c_int_p]
    lib.flash_stages_limits.restype = c_int
    lib.flash_stages_runs_here.argtypes = [c_int, c_int] + msg
    lib.flash_stages_runs_here.restype = c_int
    # batch, heads_q, heads_kv, seq_q, head_dim, page_size, max_pages_per_seq
    lib.flash_stages_forward_paged_workspace_size.argtypes = [c_int] + [c_int] * 7 + [ctypes.POINTER(c_size_t)] + msg
    lib.flash_stages_forward_paged_workspace_size.restype = c_int
    # stage; q, k_pages, v_pages, page_table, cache_lens, o, lse; batch, heads_q, heads_kv, seq_q, head_dim,
    # page_size, num_pages, max_pages_per_seq; scale, causal, dtype, workspace, workspace_bytes, device, stream
    lib.flash_stages_forward_paged.argtypes = ([c_int] + [c_void_p] * 7 + [c_int] * 8 +
                                               [c_float, c_int, c_int, c_void_p, c_size_t, c_int, c_void_p] + msg)
    lib.flash_stages_forward_paged.restype = c_int


def lib():
    """The loaded C library (loaded once, on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not os.path.exists(path):
                raise StageError(
                    f"flash_stages: the C library {path} is missing. Build it (cmake --build <build> --target "
                    f"flash_stages_c) and put <build>/python on PYTHONPATH, or point FLASH_STAGES_LIBRARY at it.")
            try:
                loaded = ctypes.CDLL(path)
            except OSError as e:
                raise StageError(f"flash_stages: could not load {path}: {e}") from e
            _declare(loaded)
            version = loaded.flash_stages_abi_version()
            if version != ABI_VERSION:
                raise StageError(f"flash_stages: {path} has C ABI version {version}, this package needs "
                                 f"{ABI_VERSION}: rebuild the library and the package together")
            _lib = loaded
    return _lib


def _decode(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def stages():
    """Every stage of the course, in course order, as a tuple of Stage."""
    global _stages
    if _stages is not None:
        return _stages
    L = lib()
    found = []
    for index in range(L.flash_stages_count()):
        number, causal, backward, count = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        folder, name, lesson, dtype = (ctypes.c_char_p() for _ in range(4))
        head_dims = (ctypes.c_int * _MAX_HEAD_DIMS)()
        code = L.flash_stages_info(index, ctypes.byref(number), ctypes.byref(folder), ctypes.byref(name),
                                   ctypes.byref(lesson), ctypes.byref(dtype), ctypes.byref(causal),
                                   ctypes.byref(backward), head_dims, _MAX_HEAD_DIMS, ctypes.byref(count))
        if code != SUCCESS:
            raise StageError(f"flash_stages: flash_stages_info({index}) failed with status {code}")
        dtypes = tuple(d for d in _decode(dtype.value).replace(",", " ").split() if d)
        max_seq_q, paged, backward_atomic = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        code = L.flash_stages_limits(index, ctypes.byref(max_seq_q), ctypes.byref(paged),
                                     ctypes.byref(backward_atomic))
        if code != SUCCESS:
            raise StageError(f"flash_stages: flash_stages_limits({index}) failed with status {code}")
        found.append(Stage(number=number.value, folder=_decode(folder.value), name=_decode(name.value),
                           lesson=_decode(lesson.value), dtypes=dtypes,
                           head_dims=tuple(head_dims[i] for i in range(min(count.value, _MAX_HEAD_DIMS))),
                           causal=bool(causal.value), backward=bool(backward.value), max_seq_q=max_seq_q.value,
                           paged=bool(paged.value), backward_atomic=bool(backward_atomic.value)))
    _stages = tuple(found)
    return _stages


def stage_number(stage):
    """stage (an int, a Stage, a numpy integer) as an int; TypeError naming `stage` otherwise. Whether
    it is a stage of the course is get_stage's to say."""
    if isinstance(stage, Stage):
        return stage.number
    if isinstance(stage, bool):
        raise TypeError(f"stage must be an int (a stage number), got bool {stage}")
    if isinstance(stage, int):
        return stage
    try:
        return operator.index(stage)  # numpy integers and the like
    except TypeError:
        raise TypeError(f"stage must be an int (a stage number), got {type(stage).__name__}") from None


def get_stage(stage):
    """The Stage with this course number; TypeError/ValueError naming `stage` otherwise."""
    number = stage_number(stage)
    found = _by_number.get(number)
    if found is not None:
        return found
    for s in stages():
        _by_number[s.number] = s
        if s.number == number:
            return s
    numbers = ", ".join(str(s.number) for s in stages())
    raise ValueError(f"stage = {number} is not a stage of the course (stages: {numbers})")


def check_status(code, message, what):
    """Raises for a non-success status of the C library: ValueError for the caller's arguments,
    RuntimeError for CUDA (and internal) errors, with the C library's message."""
    if code == SUCCESS:
        return
    text = _decode(message.value) or _decode(lib().flash_stages_status_name(code))
    if code in _RUNTIME_CODES:
        raise RuntimeError(f"{what}: {text}")
    raise ValueError(f"{what}: {text}")


def message_buffer():
    return ctypes.create_string_buffer(_MESSAGE_BYTES)


def workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, *, backward=False):
    """Bytes of device workspace one forward (backward) call of `stage` needs; 0 for most stages."""
    s = get_stage(stage)
    if backward and not s.backward:
        raise ValueError(f"stage = {s.number} ({s.name}) has no backward; stages with a backward: "
                         f"{backward_stage_list()}")
    for name, value in (("batch", batch), ("heads_q", heads_q), ("heads_kv", heads_kv), ("seq_q", seq_q),
                        ("seq_kv", seq_kv), ("head_dim", head_dim)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= value <= 2**31 - 1:
            raise ValueError(f"{name} = {value} must be >= 1 and fit in a 32-bit int")
    L = lib()
    out = ctypes.c_size_t(0)
    msg = message_buffer()
    fn = L.flash_stages_backward_workspace_size if backward else L.flash_stages_forward_workspace_size
    code = fn(s.number, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, ctypes.byref(out), msg, len(msg))
    check_status(code, msg, f"{'backward' if backward else 'forward'} workspace of {s}")
    return out.value


def paged_workspace_bytes(stage, batch, heads_q, heads_kv, seq_q, head_dim, page_size, max_pages_per_seq):
    """Bytes of device workspace one paged forward call of `stage` needs (ValueError: no paged entry point)."""
    s = get_stage(stage)
    if not s.paged:
        raise ValueError(f"stage = {s.number} ({s.name}) has no paged entry point; stages with one: "
                         f"{paged_stage_list()}")
    for name, value in (("batch", batch), ("heads_q", heads_q), ("heads_kv", heads_kv), ("seq_q", seq_q),
                        ("head_dim", head_dim), ("page_size", page_size), ("max_pages_per_seq", max_pages_per_seq)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if not 1 <= value <= 2**31 - 1:
            raise ValueError(f"{name} = {value} must be >= 1 and fit in a 32-bit int")
    out = ctypes.c_size_t(0)
    msg = message_buffer()
    code = lib().flash_stages_forward_paged_workspace_size(s.number, batch, heads_q, heads_kv, seq_q, head_dim,
                                                           page_size, max_pages_per_seq, ctypes.byref(out), msg,
                                                           len(msg))
    check_status(code, msg, f"paged workspace of {s}")
    return out.value


def paged_stage_list():
    with_paged = [str(s.number) for s in stages() if s.paged]
    return ", ".join(with_paged) if with_paged else "none"


def backward_stage_list():
    with_backward = [str(s.number) for s in stages() if s.backward]
    return ", ".join(with_backward) if with_backward else "none yet"


@functools.lru_cache(maxsize=None)
def runs_here(stage, device):
    """Whether stage number `stage` runs on CUDA device index `device` with this build (its compute
    capabilities, and for the Hopper stages whether the library has their sm_90a code). No launch;
    asked once per stage and device."""
    msg = message_buffer()
    return lib().flash_stages_runs_here(stage, device, msg, len(msg)) == 0

"""The parts of flash_stages that need no GPU: import (without torch too), the stage table, the C
ABI's argument checks and status mapping, and the checks that reject a CPU tensor. CI runs these."""

import ctypes
import os
import subprocess
import sys

import pytest

import flash_stages
from flash_stages import _lib


def run_python(code):
    """Runs code in a fresh interpreter with this one's PYTHONPATH; returns (returncode, output)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ),
                          timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_import_does_not_import_torch():
    code = ("import sys, flash_stages\n"
            "assert 'torch' not in sys.modules, 'import flash_stages imported torch'\n"
            "print(len(flash_stages.stages()))\n"
            "assert 'torch' not in sys.modules, 'stages() imported torch'\n")
    rc, out = run_python(code)
    assert rc == 0, out


def test_works_without_torch():
    # sys.modules['torch'] = None makes every `import torch` fail, as on a machine without it.
    code = ("import sys\n"
            "sys.modules['torch'] = None\n"
            "import flash_stages\n"
            "assert [s.number for s in flash_stages.stages()][0] == 1\n"
            "try:\n"
            "    flash_stages.forward(None, None, None, stage=1)\n"
            "except ImportError as e:\n"
            "    assert 'PyTorch' in str(e), e\n"
            "    print('ok')\n")
    rc, out = run_python(code)
    assert rc == 0 and "ok" in out, out


def test_library_is_next_to_the_package():
    assert os.path.exists(flash_stages.library_path())
    assert _lib.lib().flash_stages_abi_version() == flash_stages.ABI_VERSION


def test_stages_listing():
    stages = flash_stages.stages()
    assert len(stages) >= 6
    numbers = [s.number for s in stages]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    assert numbers[:6] == [1, 2, 3, 4, 5, 6]
    for s in stages:
        assert isinstance(s, flash_stages.Stage)
        assert s.name and s.lesson and s.folder.startswith(f"{s.number:02d}_")
        assert s.dtypes and all(isinstance(d, str) for d in s.dtypes)
        assert s.head_dims and all(d in (32, 64, 128) for d in s.head_dims)
        assert isinstance(s.causal, bool) and isinstance(s.backward, bool)
    by_number = {s.number: s for s in stages}
    assert not any(by_number[n].causal for n in range(1, 6)), "stages 01-05 have no causal mask"
    assert by_number[6].causal
    assert not any(by_number[n].backward for n in range(1, 7)), "the forward stages have no backward"
    assert "fp32" in by_number[1].dtypes and by_number[1].torch_dtype_names == ("float32",)
    assert stages is flash_stages.stages()  # cached
    assert flash_stages.get_stage(6) is by_number[6]


def test_stage_lookup_errors():
    with pytest.raises(ValueError, match=r"stage = 99 is not a stage"):
        flash_stages.get_stage(99)
    with pytest.raises(TypeError, match="stage must be an int"):
        flash_stages.get_stage("6")
    with pytest.raises(TypeError, match="stage must be an int"):
        flash_stages.get_stage(True)


def test_workspace_sizes():
    # Stage 01 keeps the batch*heads_q*seq_q*seq_kv score matrix; stage 06 needs nothing.
    assert flash_stages.forward_workspace_bytes(1, 2, 4, 2, 100, 200, 64) == 2 * 4 * 100 * 200 * 4
    assert flash_stages.forward_workspace_bytes(6, 2, 4, 2, 100, 200, 64) == 0
    with pytest.raises(ValueError, match="has no backward"):
        flash_stages.backward_workspace_bytes(6, 1, 1, 1, 1, 1, 64)
    with pytest.raises(ValueError, match="heads_q not a multiple of heads_kv"):
        flash_stages.forward_workspace_bytes(1, 1, 3, 2, 1, 1, 64)
    with pytest.raises(ValueError, match="seq_q = 0"):
        flash_stages.forward_workspace_bytes(1, 1, 1, 1, 0, 1, 64)
    with pytest.raises(TypeError, match="batch must be an int"):
        flash_stages.forward_workspace_bytes(1, 1.5, 1, 1, 1, 1, 64)


def test_backward_workspace_of_stages_with_a_backward():
    with_backward = [s for s in flash_stages.stages() if s.backward]
    if not with_backward:
        pytest.skip("no stage has a backward yet")
    for s in with_backward:
        assert flash_stages.backward_workspace_bytes(s.number, 2, 4, 2, 100, 200, 64) >= 0


def c_forward(stage, ptrs, dims, *, causal=0, scale=0.125, device=-1, dtype=0):
    msg = _lib.message_buffer()
    code = _lib.lib().flash_stages_forward(stage, *ptrs, *dims, scale, causal, dtype, None, 0, device, None, msg,
                                           len(msg))
    return code, msg


# The C ABI's own checks run before any launch, so with device = -1 (use the current device, none
# here) they work without a GPU. Pointers are fake and never dereferenced.
FAKE = [16, 32, 48, 64, 80]


@pytest.mark.parametrize("ptrs, dims, causal, code, text", [
    ([None] * 5, (1, 1, 1, 1, 1, 64), 0, _lib.NULL_POINTER, "null pointer: q is null"),
    (FAKE[:1] + [None] + FAKE[2:], (1, 1, 1, 1, 1, 64), 0, _lib.NULL_POINTER, "k is null"),
    (FAKE, (1, 1, 1, 0, 1, 64), 0, _lib.INVALID_DIMENSION, "seq_q = 0"),
    (FAKE, (1, 1, 1, 1, 1, 48), 0, _lib.HEAD_DIM_NOT_SUPPORTED, "head_dim = 48"),
    (FAKE, (1, 3, 2, 1, 1, 64), 0, _lib.HEADS_NOT_DIVISIBLE, "heads_q = 3, heads_kv = 2"),
    ([17] + FAKE[1:], (1, 1, 1, 1, 1, 64), 0, _lib.MISALIGNED_POINTER, "q is not 16-byte aligned"),
], ids=["null-q", "null-k", "seq_q-0", "head_dim-48", "heads", "misaligned"])
def test_c_abi_argument_checks(ptrs, dims, causal, code, text):
    got, msg = c_forward(6, ptrs, dims, causal=causal)
    assert got == code and text in msg.value.decode(), (got, msg.value)
    with pytest.raises(ValueError, match=text):
        _lib.check_status(got, msg, "forward")


def test_c_abi_stage_errors():
    got, msg = c_forward(3, FAKE, (1, 1, 1, 1, 1, 64), causal=1)
    assert got == _lib.NOT_SUPPORTED and msg.value == b"not supported by this stage: causal = 1"
    got, msg = c_forward(42, FAKE, (1, 1, 1, 1, 1, 64))
    assert got == _lib.INVALID_ARGUMENT and b"stage = 42 is not a stage" in msg.value
    got, msg = c_forward(1, FAKE, (1, 1, 1, 1, 1, 64))  # stage 01 needs a workspace
    assert got == _lib.WORKSPACE_TOO_SMALL and b"needs 4" in msg.value
    msg = _lib.message_buffer()
    got = _lib.lib().flash_stages_backward(6, *([16] * 9), 1, 1, 1, 1, 1, 64, 0.125, 0, 0, 0, None, 0, -1, None, msg,
                                           len(msg))
    assert got == _lib.NOT_SUPPORTED and b"has no backward" in msg.value


def test_c_abi_cuda_error_is_runtime_error():
    # Device 99 does not exist (and without a GPU there is no device at all): CUDA fails before any
    # launch, the status is CUDA_ERROR with CUDA's message, and Python raises RuntimeError.
    got, msg = c_forward(6, FAKE, (1, 1, 1, 1, 1, 64), device=99)
    assert got == _lib.CUDA_ERROR and msg.value.startswith(b"CUDA error: "), msg.value
    with pytest.raises(RuntimeError, match="CUDA error"):
        _lib.check_status(got, msg, "forward")


def test_c_abi_message_is_truncated_safely():
    small = ctypes.create_string_buffer(8)
    got = _lib.lib().flash_stages_forward(6, None, None, None, None, None, 1, 1, 1, 1, 1, 64, 0.125, 0, 0, None, 0,
                                          -1, None, small, len(small))
    assert got == _lib.NULL_POINTER and small.value == b"null po"
    # No buffer at all is fine too.
    assert _lib.lib().flash_stages_forward(6, None, None, None, None, None, 1, 1, 1, 1, 1, 64, 0.125, 0, 0, None, 0, -1,
                                           None, None, 0) == _lib.NULL_POINTER


def test_c_abi_info_out_of_range():
    L = _lib.lib()
    assert L.flash_stages_info(-1, *([None] * 8), 0, None) == _lib.INVALID_ARGUMENT
    assert L.flash_stages_info(L.flash_stages_count(), *([None] * 8), 0, None) == _lib.INVALID_ARGUMENT
    assert L.flash_stages_status_name(_lib.CUDA_ERROR) == b"CUDA error"


# With torch but no GPU: a CPU tensor is refused by name before anything reaches CUDA.
def test_cpu_tensor_is_refused():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    q = torch.zeros(1, 1, 4, 64)
    with pytest.raises(ValueError, match=r"q must be a CUDA tensor, got a tensor on cpu"):
        flash_stages.forward(q, q, q, stage=6)
    with pytest.raises(ValueError, match=r"q must be a CUDA tensor"):
        flash_stages.attention(q, q, q)
    with pytest.raises(TypeError, match=r"k must be a torch.Tensor, got list"):
        flash_stages.forward(q, [1.0], q, stage=6)
    with pytest.raises(TypeError, match="stage must be an int"):
        flash_stages.forward(q, q, q, stage="six")
    with pytest.raises(ValueError, match="stage = 0 is not a stage"):
        flash_stages.forward(q, q, q, stage=0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_stages.forward(q, q, q, stage=6, causal="yes")


def test_decoding_stage_in_the_listing():
    stages = flash_stages.stages()
    numbers = [s.number for s in stages]
    assert {11, 12, 13} <= set(numbers), "stages 11, 12 and 13 are written"
    s = flash_stages.get_stage(13)
    assert "decoding" in s.name
    assert s.max_seq_q == 16 and s.paged and s.causal and not s.backward
    assert s.head_dims == (64, 128) and set(s.dtypes) == {"bf16", "fp16"}
    assert s.supports(dtype="bfloat16", head_dim=128, seq_q=16, paged=True)
    assert not s.supports(dtype="bfloat16", head_dim=128, seq_q=17)
    assert not s.supports(head_dim=32)
    for other in stages:
        if other.number != 13:
            assert other.max_seq_q == 0 and not other.paged, other
    # attention() never picks the decoding stage for more query rows than it takes.
    assert flash_stages.default_stage("bfloat16", 128, False, seq_q=1024).number == 11
    with pytest.raises(ValueError, match="no paged entry point"):
        flash_stages.decode_paged_workspace_bytes(10, 1, 32, 8, 1, 128, 256, 512)


def test_decoding_workspace_sizes():
    # The paged call plans its splits for the cache's capacity (512 pages of 256 keys = 131072 keys).
    assert flash_stages.decode_paged_workspace_bytes(13, 1, 32, 8, 1, 128, 256, 512) == \
        flash_stages.forward_workspace_bytes(13, 1, 32, 8, 1, 131072, 128) == 128 * 32 * 129 * 4
    # 256 sequences fill the GPU without splitting: no workspace.
    assert flash_stages.forward_workspace_bytes(13, 256, 32, 8, 1, 4096, 128) == 0


def c_forward_paged(stage, ptrs, dims, *, page_size=64, num_pages=8, max_pages=4, dtype=2, workspace_bytes=0):
    """ptrs: q, k_pages, v_pages, page_table, cache_lens, o, lse; dims: batch, heads_q, heads_kv, seq_q, head_dim."""
    msg = _lib.message_buffer()
    code = _lib.lib().flash_stages_forward_paged(stage, *ptrs, *dims, page_size, num_pages, max_pages, 0.125, 0, dtype,
                                                 None, workspace_bytes, -1, None, msg, len(msg))
    return code, msg


PAGED_FAKE = [16, 32, 48, 64, 80, 96, 112]


@pytest.mark.parametrize("ptrs, dims, kwargs, code, text", [
    (PAGED_FAKE[:3] + [None] + PAGED_FAKE[4:], (1, 4, 2, 1, 128), {}, _lib.NULL_POINTER, "page_table is null"),
    (PAGED_FAKE[:4] + [None] + PAGED_FAKE[5:], (1, 4, 2, 1, 128), {}, _lib.NULL_POINTER, "cache_lens is null"),
    (PAGED_FAKE, (1, 4, 2, 17, 128), {}, _lib.NOT_SUPPORTED, "seq_q = 17"),
    (PAGED_FAKE, (1, 4, 2, 1, 32), {}, _lib.HEAD_DIM_NOT_SUPPORTED, "head_dim = 32 (supported: 64, 128)"),
    (PAGED_FAKE, (1, 4, 2, 1, 128), dict(page_size=24), _lib.INVALID_ARGUMENT,
     "page_size = 24 (must be a power of two from 16 to 65536)"),
    (PAGED_FAKE, (1, 4, 2, 1, 128), dict(num_pages=0), _lib.INVALID_DIMENSION, "num_pages = 0"),
    (PAGED_FAKE, (1, 4, 2, 1, 128), dict(dtype=0), _lib.DTYPE_NOT_SUPPORTED, "dtype = fp32"),
], ids=["null-page_table", "null-cache_lens", "seq_q-17", "head_dim-32", "page_size-24", "num_pages-0", "fp32"])
def test_c_abi_paged_argument_checks(ptrs, dims, kwargs, code, text):
    got, msg = c_forward_paged(13, ptrs, dims, **kwargs)
    assert got == code and text in msg.value.decode(), (got, msg.value)


def test_c_abi_paged_stage_errors():
    got, msg = c_forward_paged(10, PAGED_FAKE, (1, 4, 2, 1, 128))
    assert got == _lib.NOT_SUPPORTED and b"stage 10 (flash2) has no paged entry point" in msg.value
    got, msg = c_forward_paged(15, PAGED_FAKE, (1, 4, 2, 1, 128))
    assert got == _lib.INVALID_ARGUMENT and b"stage = 15 is not a stage (stages: 1 to 14)" in msg.value
    L = _lib.lib()
    assert L.flash_stages_limits(-1, None, None, None) == _lib.INVALID_ARGUMENT
    assert L.flash_stages_limits(L.flash_stages_count(), None, None, None) == _lib.INVALID_ARGUMENT


def test_tensor_core_backward_in_the_listing():
    s = flash_stages.get_stage(11)
    assert s.backward and s.backward_atomic and s.causal and not s.paged
    assert set(s.dtypes) == {"bf16", "fp16"} and s.head_dims == (32, 64, 128)
    assert not flash_stages.get_stage(7).backward_atomic, "stage 07 has no atomics"
    # attention() in a half dtype: stage 11 (whose forward is stage 10's); in fp32: stage 07.
    for dtype in ("bfloat16", "float16"):
        for causal in (False, True):
            assert flash_stages.default_stage(dtype, 64, causal, seq_q=1024).number == 11
    assert flash_stages.default_stage("float32", 64, True).number == 7
    # The workspace: D and the fp32 dQ accumulator, O(N); the accumulator's rows are whole query tiles
    # (seq_q rounded up to 128).
    assert flash_stages.backward_workspace_bytes(11, 2, 8, 2, 1000, 7, 128) == 2 * 8 * (1000 + 1024 * 128) * 4


def c_backward(stage, ptrs, dims, *, dtype=2, deterministic=0, workspace_bytes=0):
    """ptrs: q, k, v, o, lse, do, dq, dk, dv; dims: batch, heads_q, heads_kv, seq_q, seq_kv, head_dim."""
    msg = _lib.message_buffer()
    code = _lib.lib().flash_stages_backward(stage, *ptrs, *dims, 0.125, 0, dtype, deterministic, None, workspace_bytes,
                                            -1, None, msg, len(msg))
    return code, msg


BACKWARD_FAKE = [16 * (i + 1) for i in range(9)]


@pytest.mark.parametrize("stage, ptrs, dims, kwargs, code, text", [
    (11, BACKWARD_FAKE[:5] + [None] + BACKWARD_FAKE[6:], (1, 2, 1, 5, 7, 64), {}, _lib.NULL_POINTER, "d_o is null"),
    (11, BACKWARD_FAKE, (1, 2, 1, 5, 7, 64), dict(dtype=0), _lib.DTYPE_NOT_SUPPORTED, "dtype = fp32"),
    (11, BACKWARD_FAKE, (1, 2, 1, 5, 7, 64), dict(dtype=0, deterministic=1), _lib.DTYPE_NOT_SUPPORTED, "dtype = fp32"),
    (11, BACKWARD_FAKE, (1, 2, 1, 5, 7, 64), dict(dtype=7), _lib.INVALID_ARGUMENT, "dtype"),
    (11, BACKWARD_FAKE, (1, 2, 1, 5, 7, 64), {}, _lib.WORKSPACE_TOO_SMALL, "needs"),
    (11, BACKWARD_FAKE, (1, 2, 1, 5, 7, 48), {}, _lib.HEAD_DIM_NOT_SUPPORTED, "head_dim = 48"),
    (7, BACKWARD_FAKE, (1, 2, 1, 5, 7, 64), dict(dtype=2), _lib.DTYPE_NOT_SUPPORTED, "dtype = bf16"),
], ids=["null-d_o", "fp32", "fp32-deterministic", "dtype-7", "workspace", "head_dim-48", "stage07-bf16"])
def test_c_abi_backward_argument_checks(stage, ptrs, dims, kwargs, code, text):
    got, msg = c_backward(stage, ptrs, dims, **kwargs)
    assert got == code and text in msg.value.decode(), (got, msg.value)


def test_default_stage_takes_the_hopper_stages_only_where_they_run():
    assert flash_stages.runs_here(99, 0) is False  # no such stage
    # Without a device, never an architecture-specific stage; with one, stage 14 exactly where it runs.
    assert flash_stages.default_stage("bfloat16", 128, True, seq_q=1024).number == 11
    here = flash_stages.runs_here(14, 0)
    assert flash_stages.default_stage("bfloat16", 128, True, seq_q=1024, device=0).number == (14 if here else 11)
    # head_dim 32: stage 14 too, on head_dim 64's tiles after stage 10's forward.
    assert flash_stages.default_stage("bfloat16", 32, True, seq_q=1024, device=0).number == (14 if here else 11)

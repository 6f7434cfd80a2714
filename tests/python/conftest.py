"""pytest setup for the flash_stages tests: the gpu marker, and a report header that says which
library and which PyTorch the run used (or why the GPU tests will skip)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs PyTorch and a CUDA device (skips with the reason otherwise)")
    # PyTorch's own warn-once when its autograd thread first reaches cuBLAS before that thread has
    # a current CUDA context (it then sets the primary context itself); nothing of ours.
    config.addinivalue_line("filterwarnings",
                            "ignore:Attempting to run cuBLAS, but there was no current CUDA context:UserWarning")


def pytest_report_header(config):
    lines = []
    # torch first, as a user would: its CUDA runtime is then the one the C library shares.
    try:
        import torch
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        lines.append(f"torch {torch.__version__}: {gpu}")
    except ImportError:
        lines.append("torch: not installed")
    try:
        import flash_stages
        lines.append(f"flash_stages: {flash_stages.library_path()} ({len(flash_stages.stages())} stages, with a "
                     f"backward: {[s.number for s in flash_stages.stages() if s.backward] or 'none'})")
    except Exception as e:  # the tests themselves report it properly
        lines.append(f"flash_stages: not importable ({e}); is PYTHONPATH=<build>/python set?")
    return lines

#!/usr/bin/env python3
"""ctest's entry point for the Python tests: runs pytest with the given arguments, or, where
pytest is not installed for this interpreter, says so and exits 0 so that ctest reports the entry
as skipped (its SKIP_REGULAR_EXPRESSION matches the line below) instead of failed."""

import importlib.util
import sys

if importlib.util.find_spec("pytest") is None:
    print(f"flash_stages Python tests not run: pytest is not installed for {sys.executable} "
          "(python3 -m pip install pytest)")
    sys.exit(0)

import pytest  # noqa: E402

sys.exit(pytest.main(sys.argv[1:]))

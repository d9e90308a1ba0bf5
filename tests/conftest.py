"""Test-session hooks and fixtures shared by every test file."""

from __future__ import annotations

import pytest

import fuzz_seed
import kernel_library


@pytest.fixture(scope="module")
def ops():
    """The kernel library's ops (ops.autofuse_kernel), loaded once a module."""
    return kernel_library.load()


def pytest_terminal_summary(terminalreporter):
    """Say the commit's fuzz seed at the end of every run, so that a failure of
    test_fuzz_regressions.py::test_fuzz_on_the_commit_seed can be rerun anywhere."""
    seed, source = fuzz_seed.commit_seed()
    terminalreporter.write_line(f"tf_autofuse fuzz seed: {seed} ({source}); rerun a graph with "
                                f"python scripts/fuzz_long.py --seed {seed} --only I")

"""The kernel library the tests run: the one tf_autofuse loads (built on first use), or a
library built by hand named by TF_AUTOFUSE_TEST_LIBRARY.

The `ops` fixture of conftest.py is `load()`; tests that start processes of their own give them
`path()`.
"""

from __future__ import annotations

import os

import tensorflow as tf

OVERRIDE = "TF_AUTOFUSE_TEST_LIBRARY"


def load():
    """The op module of the kernel library (ops.autofuse_kernel)."""
    override = os.environ.get(OVERRIDE)
    if override:
        return tf.load_op_library(override)
    try:
        from tf_autofuse import _native

        return _native.load()
    except Exception:  # the official loader may not be usable yet; build and load directly
        from tf_autofuse import _build

        return tf.load_op_library(str(_build.library_path()))


def path() -> str:
    """The file of the kernel library, for a process to tf.load_op_library."""
    override = os.environ.get(OVERRIDE)
    if override:
        return override
    from tf_autofuse import _build

    return str(_build.library_path())

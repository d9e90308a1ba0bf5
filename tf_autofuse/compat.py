"""TF2-compat mode: TensorFlow 2 switched to v1 behaviour, with fusion registered."""

from __future__ import annotations


def enable_v1() -> None:
    """Switch TensorFlow 2 to v1 behaviour (graphs, placeholders, Sessions).

    `import tf_autofuse` has already registered the op and the optimizer; this only changes
    TensorFlow's mode, as `tf.compat.v1.disable_v2_behavior()` does.
    """
    import tensorflow as tf

    tf.compat.v1.disable_v2_behavior()

"""The ConfigProto of tests that run TF1 Sessions through the plugin's named optimizer."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import tf_autofuse

OFF = rewriter_config_pb2.RewriterConfig.OFF


def config(fuse: bool = True, params=None, arithmetic: bool = True, remapping: bool = True,
           **proto):
    """A ConfigProto (`proto`: its fields, e.g. intra_op_parallelism_threads) whose rewriter runs
    the named AutofuseOptimizer when `fuse`, with `params` in its parameter_map, and no plugin
    pass, so that AUTOFUSE_FLAGS in the environment changes nothing; arithmetic=False also turns
    Grappler's arithmetic optimizer off, remapping=False its remapper."""
    cfg = tf.compat.v1.ConfigProto(**proto)
    rewrite = cfg.graph_options.rewrite_options
    rewrite.use_plugin_optimizers = OFF
    if not arithmetic:
        rewrite.arithmetic_optimization = OFF
    if not remapping:
        rewrite.remapping = OFF
    if fuse:
        custom = rewrite.custom_optimizers.add()
        custom.name = tf_autofuse.OPTIMIZER_NAME
        for key, value in (params or {}).items():
            custom.parameter_map[key].s = str(value).encode()
    return cfg

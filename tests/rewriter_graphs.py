"""GraphDefs for the rewriter's tests: built node by node (NodeDef protos) or with the TF1 API,
run in a plain Session, and with each fused node expanded into the TF ops its program names,
which checks the rewiring (inputs, views, immediates, reductions, outputs, Identities, control
edges) without the kernel."""

from __future__ import annotations

import types

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2
from tensorflow.core.protobuf import rewriter_config_pb2

from tf_autofuse import rewriter
from tf_autofuse.rewriter import catalog
from tf_autofuse.rewriter import program as ir

tf1 = tf.compat.v1
F16, F32, F64 = types_pb2.DT_HALF, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE
I32, I64 = types_pb2.DT_INT32, types_pb2.DT_INT64
CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"

# --- building -----------------------------------------------------------------------------------


def node(name, op, inputs=(), dtype=F32, device="", **attrs):
    n = node_def_pb2.NodeDef(name=name, op=op, device=device)
    n.input.extend(inputs)
    if dtype is not None:
        n.attr["T"].type = dtype
    for key, value in attrs.items():
        if key == "op_names":
            n.attr[key].list.s.extend(v.encode() for v in value)
        elif key == "_output_shapes":
            for shape in value:
                proto = n.attr[key].list.shape.add()
                for d in shape:
                    proto.dim.add().size = d
        else:
            raise ValueError(key)
    return n


def placeholder(name, dtype=F32, shape=(4, 3), device=""):
    n = node_def_pb2.NodeDef(name=name, op="Placeholder", device=device)
    n.attr["dtype"].type = dtype
    if shape is None:
        n.attr["shape"].shape.unknown_rank = True
    else:
        for d in shape:
            n.attr["shape"].shape.dim.add().size = d
    return n


def const(name, value, dtype=tf.float32):
    n = node_def_pb2.NodeDef(name=name, op="Const")
    n.attr["dtype"].type = dtype.as_datatype_enum
    n.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(value), dtype))
    return n


def graph(*nodes):
    g = graph_pb2.GraphDef()
    g.node.extend(nodes)
    return g


def chain(ops, dtype=F32, shape=(4, 3), device="", source="x"):
    """x -> ops[0] -> ops[1] ...; node names are the op types."""
    nodes = [placeholder(source, dtype, shape, device)]
    previous = source
    for op in ops:
        nodes.append(node(op, op, [previous], dtype, device))
        previous = op
    return nodes


def by_name(graph_def):
    return {n.name: n for n in graph_def.node}


def fused_nodes(graph_def):
    return [n for n in graph_def.node if n.op == "AutofuseKernel"]


def program_of(n):
    return n.attr["program"].s.decode()


def op_types(graph_def):
    return sorted(n.op for n in graph_def.node)


def serialized(graph_def):
    return graph_def.SerializeToString(deterministic=True)


def flags(max_fusion_size):
    return types.SimpleNamespace(max_fusion_size=max_fusion_size)


# --- running and expanding ----------------------------------------------------------------------


_TF_OP = {spec.ir_name: spec.tf_ops[0] for spec in catalog.OPS}


def shape_const(name, dims):
    return const(name, np.array([-1 if d < 0 else d for d in dims], np.int32), tf.int32)


def expand_fused(graph_def):
    """Each AutofuseKernel -> the TF ops its program means (views: Reshape; reductions:
    keep_dims=True over the iteration axes; immediates: Consts of the operand dtype)."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    for n in graph_def.node:
        if n.op != "AutofuseKernel":
            out.node.add().CopyFrom(n)
            continue
        p = ir.parse(program_of(n))
        dtypes = p.value_dtypes()
        data = [i for i in n.input if not i.startswith("^")]
        controls = [i for i in n.input if i.startswith("^")]
        values, kinds = {}, {}
        for k, (src, decl) in enumerate(zip(data, p.inputs)):
            kinds[ir.In(k)] = decl.dtype
            if decl.view is None:
                values[ir.In(k)] = src
                continue
            shape = shape_const(f"{n.name}/in{k}_shape", decl.view)
            view = node(f"{n.name}/in{k}", "Reshape", [src, shape.name], ir.DTYPES[decl.dtype])
            view.attr["Tshape"].type = types_pb2.DT_INT32
            out.node.extend([shape, view])
            values[ir.In(k)] = view.name
        for i, inst in enumerate(p.instructions):
            spec = catalog.for_ir_name(inst.op)
            roles = spec.operand_roles()
            data_dtype = next((kinds[o] for o, r in zip(inst.operands, roles)
                               if isinstance(o, ir.Ref) and r == "data"), "bool")
            operands = []
            for j, (operand, role) in enumerate(zip(inst.operands, roles)):
                if isinstance(operand, ir.Ref):
                    operands.append(values[operand])
                    continue
                kind = "bool" if role == "bool" else data_dtype
                c = const(f"{n.name}/imm{i}_{j}", operand, tf.as_dtype(ir.DTYPES[kind]))
                out.node.append(c)
                operands.append(c.name)
            attrs = dict(inst.attrs)
            name = f"{n.name}/v{i}"
            t = ir.DTYPES[data_dtype]
            if spec.kind == "reduce":
                axes = const(f"{name}/axes", np.array(ir.parse_axes(attrs["axes"]), np.int32),
                             tf.int32)
                out.node.append(axes)
                new = node(name, _TF_OP[inst.op], operands + [axes.name], t)
                new.attr["keep_dims"].b = True
                new.attr["Tidx"].type = types_pb2.DT_INT32
            elif inst.op == "Cast":
                new = node(name, "Cast", operands, None)
                new.attr["SrcT"].type = t
                new.attr["DstT"].type = ir.DTYPES[attrs["to"]]
            elif spec.dtypes == catalog.BOOL:
                new = node(name, _TF_OP[inst.op], operands, None)
            else:
                new = node(name, _TF_OP[inst.op], operands, t)
                if "alpha" in attrs:
                    new.attr["alpha"].f = float(attrs["alpha"])
            out.node.append(new)
            values[ir.Val(i)] = name
            kinds[ir.Val(i)] = dtypes[i]
        results = []
        for k, (ref, view) in enumerate(zip(p.outputs, p.output_views)):
            if view is None:
                results.append(values[ref])
                continue
            shape = shape_const(f"{n.name}/out{k}_shape", view)
            reshaped = node(f"{n.name}/out{k}", "Reshape", [values[ref], shape.name],
                            ir.DTYPES[kinds[ref]])
            reshaped.attr["Tshape"].type = types_pb2.DT_INT32
            out.node.extend([shape, reshaped])
            results.append(reshaped.name)
        outputs = node(n.name, "IdentityN", results + controls, None, n.device)
        outputs.attr["T"].list.type.extend(n.attr["Tout"].list.type)
        out.node.append(outputs)
    return out


def run_graph(graph_def, fetches, feeds):
    cfg = tf1.ConfigProto()
    cfg.graph_options.rewrite_options.disable_meta_optimizer = True
    cfg.graph_options.rewrite_options.use_plugin_optimizers = rewriter_config_pb2.RewriterConfig.OFF
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(graph_def, name="")
        with tf1.Session(graph=g, config=cfg) as sess:
            return sess.run([f + ":0" for f in fetches], {k + ":0": v for k, v in feeds.items()})


def uniform(seed, shape, dtype=np.float32, low=-3, high=3):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(dtype)


REDUCE_ON = types.SimpleNamespace(max_fusion_size=64, autofuse_enable_pass=("reduce",))


def tf_graph(build):
    """A GraphDef (with _output_shapes) built with the TF1 API."""
    g = tf.Graph()
    with g.as_default():
        build()
    return g.as_graph_def(add_shapes=True)


def expanded_matches(g, fetches, values, rtol=1e-6, run=None, **kwargs):
    """The rewritten graph gives the original's numbers, run by `run(graph_def, fetches, values)`
    or, by default, with each fused node expanded into TF ops (which checks inputs, views,
    immediates, reductions and outputs without the kernel); the Rewrite."""
    result = rewriter.rewrite(g, preserve=fetches, **kwargs)
    assert result.fusions
    want = run_graph(g, fetches, values)
    if run is None:
        got = run_graph(expand_fused(result.graph_def), fetches, values)
    else:
        got = run(result.graph_def, fetches, values)
    for w, v in zip(want, got):
        assert w.dtype == v.dtype and w.shape == v.shape
        np.testing.assert_allclose(v.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                   atol=rtol)
    return result


def programs(result):
    return {f.name: f.program for f in result.fusions}


def fused_programs(g, fetches, values, **kwargs):
    """{name: program} of the fusions of `g` (a GraphDef, or a function building one with the TF1
    API), whose expansion gives the original's numbers (expanded_matches)."""
    return programs(expanded_matches(tf_graph(g) if callable(g) else g, fetches, values, **kwargs))


def gelu_tanh():
    x = tf1.placeholder(tf.float32, [8, 64], name="x")
    y = x * 0.5 * (1.0 + tf.tanh(0.7978845608 * (x + 0.044715 * tf.pow(x, 3.0))))
    tf.identity(y, name="y")


def softmax():
    x = tf1.placeholder(tf.float32, [8, 10], name="x")
    m = tf.reduce_max(x, axis=1, keepdims=True)
    e = tf.exp(x - m)
    tf.identity(e / tf.reduce_sum(e, axis=-1, keepdims=True), name="y")

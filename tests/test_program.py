"""The fused program (docs/PROGRAM.md): the Python parser and printer (rewriter/program.py) and
the IR passes every backend gets (rewriter/passes.py).

- Every program of every op prints as it parses; a faulty one is refused naming its line.
- simplify drops a Relu of a value never below -0, only where it is that value; hoist marks
  loop invariants of one small, fully known shape `invariant`, only where the rules of
  PROGRAM.md hold and it is worth it; the rewriter runs both on every kernel's program before
  printing it, and the kernel's name does not change.
- The Ascend generator reads marked programs as they are (computing invariants per tile).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_autofuse import rewriter
from tf_autofuse.codegen.ascendc import generate
from tf_autofuse.rewriter import catalog, passes
from tf_autofuse.rewriter import program as ir

from test_kernel import run_fused

tf1 = tf.compat.v1


# --- printing and parsing ----------------------------------------------------------------------


def _attrs_for(spec, name):
    attrs = {"to": "f32" if name != "f32" else "f16", "alpha": "0.2", "axes": "[1]"}
    return "".join(f" {key}={attrs[key]}" for key in sorted(spec.attrs))


def _programs_for_every_op():
    for spec in catalog.OPS:
        for dtype in sorted(spec.dtypes):
            name = ir.DTYPE_NAMES[dtype]
            attrs = _attrs_for(spec, name)
            imm = {"i32": "2", "bool": "true"}.get(name, "0.5")
            if spec.kind == "reduce":
                yield (
                    f"in0: {name}[4,3]\n%0 = {spec.ir_name} in0{attrs}\n%1 = Sub in0, %0\n"
                    f"%2 = {spec.ir_name} %1{attrs}\nout0 = %1\nout1 = %2 -> [4]\n"
                )
            elif spec.arity == 1:
                again = f"%1 = {spec.ir_name} %0{attrs}\nout0 = %1\n" if spec.result == "same" \
                    else "out0 = %0\n"
                yield f"in0: {name}[4,3]\n%0 = {spec.ir_name} in0{attrs}\n{again}"
            elif spec.arity == 2:
                again = f"%1 = {spec.ir_name} %0, {imm}\nout0 = %1\n" if spec.result == "same" \
                    else f"%1 = {spec.ir_name} in0, {imm}\nout0 = %0\nout1 = %1\n"
                yield (f"in0: {name}[?,3]\nin1: {name}[?,3] -> [?,1,3]\n"
                       f"%0 = {spec.ir_name} in0, in1\n{again}out2 = in1\n".replace(
                           "out2", "out2" if spec.result != "same" else "out1"))
            else:
                yield (f"in0: bool[4,3]\nin1: {name}[4,3]\nin2: {name}[3]\n"
                       f"%0 = {spec.ir_name} in0, in1, in2\n%1 = {spec.ir_name} false, %0, {imm}\n"
                       f"out0 = %1\n")


@pytest.mark.parametrize("text", list(_programs_for_every_op()))
def test_program_round_trip(text):
    parsed = ir.parse(text)
    assert str(parsed) == text
    assert ir.parse(str(parsed)) == parsed


def test_program_structure_and_shapes():
    text = "in0: f32[*]\nin1: bf16[]\n%0 = Mul in0, 1e-05\n%1 = Exp in1\nout0 = %0\nout1 = %1\n"
    p = ir.parse(text)
    assert p.inputs == (ir.InputDecl("f32", None), ir.InputDecl("bf16", ()))
    assert p.instructions[0] == ir.Instruction("Mul", (ir.In(0), 1e-05))
    assert p.outputs == (ir.Val(0), ir.Val(1))
    assert p.output_dtypes() == ["f32", "bf16"]
    built = ir.FusedProgram([ir.InputDecl("f16", (128, 192))],
                            [ir.Instruction("Abs", (ir.In(0),)),
                             ir.Instruction("Relu", (ir.Val(0),)),
                             ir.Instruction("Exp", (ir.Val(1),))],
                            [ir.Val(2)])
    assert built.print() == ("in0: f16[128,192]\n%0 = Abs in0\n%1 = Relu %0\n%2 = Exp %1\n"
                             "out0 = %2\n")


# (program, the line both parsers name, 0 for the program as a whole; what the kernel says)
FAULTY = [
    ("in0: f16[4]\n\n%0 = Abs in0\nout0 = %0\n", 2, "blank line"),
    ("in0: f16[4]\n%0 = Abs in0\n%1 = Exp %2\nout0 = %1\n", 3, "not defined above"),
    ("in0: f16[4]\n%0 = Abs in0\n%2 = Exp %0\nout0 = %2\n", 3, "expected %1"),
    ("in0: f16[4]\n%0 = Abs in0,in0\nout0 = %0\n", 2, "separated by ', '"),
    ("in0: f16[4]\n%0 = Foo in0\nout0 = %0\n", 2, "unknown op 'Foo'"),
    ("in0: f16[4]\n%0 = Add in0\nout0 = %0\n", 2, "takes 2 operands"),
    ("in0: i32[4]\n%0 = Exp in0\nout0 = %0\n", 2, "does not allow dtype i32"),
    ("in0: i32[4]\n%0 = Mul in0, 0.5\nout0 = %0\n", 2, "is not an i32"),
    ("in0: i32[4]\n%0 = Mul in0, 2.0\nout0 = %0\n", 2, "is not an i32"),
    ("in0: i32[4]\n%0 = Mul in0, 3000000000\nout0 = %0\n", 2, "is not an i32"),
    ("in0: f32[4]\n%0 = Mul in0, inf\nout0 = %0\n", 2, "bad operand 'inf'"),
    ("in0: f32[4]\nin1: f64[4]\n%0 = Add in0, in1\nout0 = %0\n", 3, "mixes dtypes"),
    ("in0: f32[4]\n%0 = Add 1.0, 2.0\nout0 = %0\n", 2, "not an immediate"),
    ("in0: f32[4]\n%0 = Abs in0 axes=[1]\nout0 = %0\n", 2, "takes no attribute"),
    ("in0: f8[4]\n%0 = Abs in0\nout0 = %0\n", 1, "unknown dtype 'f8'"),
    ("in0: f32[4,x]\n%0 = Abs in0\nout0 = %0\n", 1, "bad dimension 'x'"),
    ("in1: f32[4]\n%0 = Abs in1\nout0 = %0\n", 1, "expected in0"),
    ("in0: f32[4]\n%0 = Abs in0\nout0 = %1\n", 3, "not defined above"),
    ("in0: f32[4]\n%0 = Abs in0\nout1 = %0\n", 3, "expected out0"),
    ("in0: f32[4]\n%0 = Abs in0\nout0 = %0\nin1: f32[4]\n", 4, "must come before"),
    ("in0: f32[4]\nout0 = in0\n", 2, "output before any instruction"),
    ("%0 = Abs in0\nout0 = %0\n", 1, "instruction before any input"),
    ("in0: f32[4]\n%0 = Abs in0\n", 2, "has no output"),
    ("in0: f32[4]\n%0 = Abs in0\nbogus\n", 3, "expected an input declaration"),
    # views
    ("in0: f32[2,3] -> [?,?]\n%0 = Abs in0\nout0 = %0\n", 1, "at most one ?"),
    ("in0: f32[2,3] -> [*]\n%0 = Abs in0\nout0 = %0\n", 1, "known rank"),
    ("in0: f32[2,3] -> [7]\n%0 = Abs in0\nout0 = %0\n", 1, "has 7 elements"),
    ("in0: f32[2,3]\n%0 = Abs in0\nout0 = %0 -> [?,?]\n", 3, "at most one ?"),
    ("in0: f32[2,3]\nin1: f32[4]\n%0 = Add in0, in1\nout0 = %0\n", 0, "do not broadcast"),
    # reductions
    ("in0: f32[2,3]\n%0 = Sum in0 axes=[0,2]\nout0 = %0\n", 2, "consecutive"),
    ("in0: f32[2,3]\n%0 = Sum in0 axes=[1,0]\nout0 = %0\n", 2, "consecutive"),
    ("in0: f32[2,3]\n%0 = Sum in0 axes=[-1]\nout0 = %0\n", 2, "bad axis"),
    ("in0: f32[2,3]\n%0 = Sum in0 axes=[2]\nout0 = %0\n", 2, "out of range"),
    ("in0: f32[2,3]\n%0 = Sum in0\nout0 = %0\n", 2, "needs the attribute axes="),
    ("in0: f32[2,3]\n%0 = Sum in0 axes=[0]\n%1 = Max in0 axes=[1]\nout0 = %1\n", 3,
     "differ from the axes [0]"),
    ("in0: f32[2,3]\n%0 = Sum in0 axes=[2]\n%1 = Max %0 axes=[2]\nout0 = %1\n", 2,
     "out of range"),
    ("in0: f32[2,3]\n%0 = Sum 1.0 axes=[1]\nout0 = %0\n", 2, "not an immediate"),
    ("in0: f32[*]\n%0 = Sum in0 axes=[0]\nout0 = %0\n", 1, "known rank"),
    ("in0: f32[4,5]\n%0 = Max in0 axes=[1]\n%1 = Sum %0 axes=[1]\nout0 = %1\n", 3,
     "a full value, not the reduced %0"),
    # in1 [5] reads as [1,1,5]: 1 along axis 1, so %1 is reduced and may not be reduced again
    ("in0: f32[2,3,5]\nin1: f32[5]\n%0 = Sum in0 axes=[1]\n%1 = Mul %0, in1\n"
     "%2 = Sum %1 axes=[1]\nout0 = %2\n", 5, "a full value, not the reduced %1"),
    # attributes
    ("in0: f32[2,3]\n%0 = Cast in0 to=i32\nout0 = %0\n", 2, "bad to='i32'"),
    ("in0: f32[2,3]\n%0 = Cast in0\nout0 = %0\n", 2, "needs the attribute to="),
    ("in0: f32[2,3]\n%0 = LeakyRelu in0 alpha=x\nout0 = %0\n", 2, "bad alpha"),
    ("in0: f32[2,3]\n%0 = LeakyRelu in0 alpha=inf\nout0 = %0\n", 2, "bad alpha"),
    ("in0: f32[2,3]\n%0 = LeakyRelu in0 to=f32\nout0 = %0\n", 2, "alpha="),
    ("in0: f32[2,3]\n%0 = LeakyRelu in0\nout0 = %0\n", 2, "needs the attribute alpha="),
    # dtypes of operands
    ("in0: f32[2,3]\n%0 = Select in0, in0, in0\nout0 = %0\n", 2, "must be bool"),
    ("in0: f32[2,3]\n%0 = LogicalNot in0\nout0 = %0\n", 2, "does not allow dtype f32"),
    ("in0: f32[2,3]\n%0 = Add in0, true\nout0 = %0\n", 2, "is not a f32"),
    ("in0: f32[2,3]\n%0 = Greater in0, 1.0\n%1 = LogicalAnd %0, 1\nout0 = %1\n", 3,
     "is not a bool"),
    # invariants (PROGRAM.md): each rule broken once
    ("in0: f32[4,3]\nin1: f32[?]\n%0 = Abs in1 invariant\n%1 = Add in0, %0\nout0 = %1\n", 3,
     "not fully known"),
    ("in0: f32[4,3]\nin1: f32[3]\n%0 = Abs in1 invariant\nout0 = %0\n", 4,
     "no invariant value"),
    ("in0: f16[4,3]\nin1: f16[3]\n%0 = Abs in1 invariant\n%1 = Add in0, %0\nout0 = %1\n", 3,
     "not 16-bit"),
    ("in0: f32[4,3]\nin1: f32[3]\n%0 = Abs in1\n%1 = Exp %0 invariant\n%2 = Add in0, %1\n"
     "out0 = %2\n", 4, "reads %0, which is not"),
    ("in0: f32[4,3]\nin1: f32[3]\nin2: f32[4,1]\n%0 = Exp in1 invariant\n"
     "%1 = Add %0, in2 invariant\n%2 = Add in0, %1\nout0 = %2\n", 5, "others read inputs as [3]"),
    ("in0: f32[4,3]\nin1: f32[3]\n%0 = Exp in1 invariant\n%1 = Add in0, %0\n"
     "%2 = Sum %1 axes=[1]\nout0 = %2\n", 3, "reductions has no invariant"),
]


def _kernel_inputs(text: str) -> list:
    """Tensors for the inputs a program declares (a parse error comes before any check of
    them); f32 where the declaration is not a dtype."""
    dtypes = {"f16": tf.float16, "f32": tf.float32, "f64": tf.float64, "i32": tf.int32}
    inputs = []
    for line in text.splitlines():
        if line.startswith("in") and ": " in line:
            inputs.append(tf.zeros([2, 3], dtypes.get(line.split(": ")[1][:3].rstrip("["),
                                                      tf.float32)))
    return inputs or [tf.zeros([2, 3])]


@pytest.mark.parametrize("text, line, message", FAULTY)
def test_both_parsers_refuse_a_faulty_program_naming_its_line(ops, text, line, message):
    """The rewriter's parser (and through it the Ascend generator) refuses what the CPU
    kernel's refuses, and both name the same line."""
    with pytest.raises(ValueError) as python:
        ir.parse(text)
    with pytest.raises(tf.errors.InvalidArgumentError) as kernel:
        run_fused(ops, text, _kernel_inputs(text), [tf.float32])
    said = str(kernel.value)
    assert message in said and "AutofuseKernel '" in said, said
    if line:
        assert str(python.value).startswith(f"line {line}:"), str(python.value)
        assert f"program line {line} " in said, said
    else:
        assert message in str(python.value) and "program line" not in said


@pytest.mark.parametrize("text", [
    "in0: f32[4]\n%0 = Abs in0\nout0 = %0",  # no final newline
    "in0: f64[4]\n%0 = Mul in0, 0.50\nout0 = %0\n",  # not as repr prints it
    "in0: f32[4]\n%0 = Mul in0, 1e-5\nout0 = %0\n",
    "in0: f32[2,3]\n%0 = Sum in0 axes=[0, 1]\nout0 = %0\n",
])
def test_only_the_rewriters_parser_holds_to_the_printed_spelling(ops, text):
    """print(parse(text)) == text: the rewriter's parser refuses another spelling of a valid
    program, which the kernel reads."""
    with pytest.raises(ValueError):
        ir.parse(text)
    run_fused(ops, text, [tf.ones([4] if "[4]" in text else [2, 3],
                                  tf.float64 if "f64" in text else tf.float32)],
              [tf.float64 if "f64" in text else tf.float32])


def test_program_views_parse_and_print():
    text = ("in0: f32[?,16] -> [?,16,1,1]\nin1: bool[]\n%0 = Sum in0 axes=[1]\n"
            "%1 = Select in1, %0, 0.5\n%2 = Cast %1 to=bf16\nout0 = %2 -> [?]\n")
    p = ir.parse(text)
    assert p.print() == text
    assert p.inputs[0] == ir.InputDecl("f32", (-1, 16), (-1, 16, 1, 1))
    assert p.output_views == ((-1,),)
    assert p.output_dtypes() == ["bf16"]
    with pytest.raises(ValueError, match="not increasing and consecutive"):
        ir.parse("in0: f32[2,3,4]\n%0 = Sum in0 axes=[0,2]\nout0 = %0\n")
    with pytest.raises(ValueError, match="same axes"):
        ir.parse("in0: f32[2,3,4]\n%0 = Sum in0 axes=[1]\n%1 = Max in0 axes=[2]\nout0 = %1\n")
    with pytest.raises(ValueError, match="at most one"):
        ir.parse("in0: f32[?,?]\n%0 = Abs in0\nout0 = %0 -> [?,?]\n")


def test_program_reduced_inputs_align_right():
    # in1 [3,5] reads as [1,3,5]: not 1 along axis 1, so %1 is a full value, reduced again
    text = ("in0: f32[2,3,5]\nin1: f32[3,5]\n%0 = Sum in0 axes=[1]\n%1 = Mul in0, in1\n"
            "%2 = Sum %1 axes=[1]\nout0 = %2\n")
    program = ir.parse(text)
    assert program.print() == text
    assert not program.is_reduced(ir.In(1)) and program.is_reduced(ir.Val(2))
    assert ir.parse(text.replace("in1: f32[3,5]", "in1: f32[5]")).is_reduced(ir.In(1))


# --- the IR passes -----------------------------------------------------------------------------

BATCHNORM = ("in0: f32[?,4,4,16]\nin1: f32[16] -> [1,1,1,16]\nin2: f32[16] -> [1,1,1,16]\n"
             "in3: f32[16] -> [1,1,1,16]\nin4: f32[16] -> [1,1,1,16]\n%0 = Add in1, 0.001\n"
             "%1 = Rsqrt %0\n%2 = Mul %1, in2\n%3 = Mul in0, %2\n%4 = Mul in3, %2\n"
             "%5 = Sub in4, %4\n%6 = Add %3, %5\n%7 = Relu %6\nout0 = %7\n")


def _ops(program: ir.FusedProgram) -> list:
    return [inst.op for inst in program.instructions]


def _invariant(program: ir.FusedProgram) -> list:
    return [i for i, inst in enumerate(program.instructions) if inst.invariant]


_NEVER_NEGATIVE = [s.ir_name for s in catalog.OPS if s.never_negative and s.arity == 1]


@pytest.mark.parametrize("producer", _NEVER_NEGATIVE)
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
def test_simplify_drops_a_relu_of_a_never_negative_value(producer, dtype):
    text = (f"in0: {dtype}[8]\n%0 = {producer} in0\n%1 = Relu %0\n%2 = Relu %1\n"
            "%3 = Neg %2\nout0 = %3\n")
    simplified = passes.simplify(ir.parse(text))
    assert _ops(simplified) == [producer, "Neg"]
    assert simplified.instructions[1].operands == (ir.Val(0),)
    assert passes.simplify(simplified) == simplified


def test_simplify_keeps_every_other_relu():
    keep = [
        "in0: f32[8]\n%0 = Neg in0\n%1 = Relu %0\n%2 = Exp %1\nout0 = %2\n",  # may be negative
        "in0: i32[8]\n%0 = Abs in0\n%1 = Relu %0\n%2 = Neg %1\nout0 = %2\n",  # i32 Abs wraps
        "in0: f32[8]\n%0 = Abs in0\n%1 = Relu %0\nout0 = %1\n",  # an output keeps its value
        "in0: f32[8]\n%0 = Relu in0\n%1 = Exp %0\nout0 = %1\n",  # of an input
    ]
    for text in keep:
        assert passes.simplify(ir.parse(text)).print() == text
    # a Relu read by an output and by another instruction: the output keeps it, the reader too
    text = "in0: f32[8]\n%0 = Exp in0\n%1 = Relu %0\n%2 = Neg %1\nout0 = %2\nout1 = %1\n"
    assert passes.simplify(ir.parse(text)).print() == text


def test_hoist_marks_the_batchnorm_invariants():
    hoisted = passes.hoist(ir.parse(BATCHNORM))
    # rsqrt(var + eps) * gamma and beta - mean * that: computed once a run over [1,1,1,16]
    assert _invariant(hoisted) == [0, 1, 2, 4, 5]
    assert ir.parse(hoisted.print()) == hoisted
    assert passes.hoist(hoisted) == hoisted


@pytest.mark.parametrize("text, why", [
    (BATCHNORM.replace("f32", "f16"), "16-bit values are kept in fp32 until the outputs"),
    (BATCHNORM.replace("f32[16] -> [1,1,1,16]", "f32[?] -> [1,1,1,?]"), "a shape not known"),
    (BATCHNORM.replace("in0: f32[?,4,4,16]", "in0: f32[16] -> [1,1,1,16]"),
     "every input of the one shape: nothing left to run per element"),
    ("in0: f32[4,16]\nin1: f32[16]\n%0 = Mul in1, 2.0\n%1 = Add in0, %0\nout0 = %1\n",
     "one cheap op: not worth a prologue"),
    ("in0: f32[4,16]\nin1: f32[16]\n%0 = Exp in1\n%1 = Add in0, in1\nout0 = %1\nout1 = %0\n",
     "an output"),
    # a GELU gradient times a scalar learning rate: the input of the full shape is the only
    # candidate, and a prologue over it computes as many elements as the loop
    ("in0: f32[1024,512] -> [16,64,512]\nin1: f32[]\n%0 = Neg in0\n%1 = Mul 0.7071, %0\n"
     "%2 = Square %1\n%3 = Erfc %1\n%4 = Neg %2\n%5 = Exp %4\n%6 = Mul %3, in0\n"
     "%7 = Mul in1, %5\nout0 = %6\nout1 = %7\n", "no input smaller than the loop"),
    ("in0: f32[4,16]\nin1: f32[4,16]\nin2: f32[]\n%0 = Exp in1\n%1 = Mul in0, %0\n"
     "%2 = Mul %1, in2\nout0 = %2\n", "the candidate as large as the other input"),
    ("in0: f32[4,16]\nin1: f32[16]\n%0 = Exp in1\n%1 = Add in0, %0\n%2 = Sum %1 axes=[1]\n"
     "out0 = %2\n", "a program with reductions"),
])
def test_hoist_leaves_alone(text, why):
    assert not _invariant(passes.hoist(ir.parse(text))), why


def test_hoist_in_f64_counts_a_cheap_op_twice():
    # f64 vectors hold half the lanes (catalog.element_cost): one Mul is worth a prologue there
    text = "in0: f64[4,16]\nin1: f64[16]\n%0 = Mul in1, 2.0\n%1 = Add in0, %0\nout0 = %1\n"
    assert _invariant(passes.hoist(ir.parse(text))) == [0]


def test_the_rewriter_runs_the_passes_before_printing():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4, 4, 16], name="x")
        var = tf1.placeholder(tf.float32, [16], name="var")
        gamma = tf1.placeholder(tf.float32, [16], name="gamma")
        scale = tf.math.rsqrt(var + 1e-3) * gamma
        tf.exp(tf.nn.relu(tf.abs(x * scale)), name="y")
    result = rewriter.rewrite(graph.as_graph_def(), preserve=["y"])
    (fusion,) = result.fusions
    # named after the fused TF nodes, whatever the passes did to the program
    assert fusion.name == "autofuse_pointwise_0_AddV2_Rsqrt_Mul_Mul_Abs_Relu_Exp"
    program = ir.parse(fusion.program)
    assert _ops(program) == ["Add", "Rsqrt", "Mul", "Mul", "Abs", "Exp"]  # no Relu of |.|
    assert _invariant(program) == [0, 1, 2]
    (node,) = [n for n in result.graph_def.node if n.op == rewriter.FUSED_OP]
    assert node.attr["program"].s.decode() == fusion.program
    assert passes.optimize(program) == program  # what the node holds is what every pass leaves


def _code(kernel) -> dict:
    """A generated kernel's sources without their comments (which quote the program)."""
    return {name: "\n".join(line for line in text.splitlines() if not line.startswith("//"))
            for name, text in kernel.sources.items()}


def test_the_ascend_generator_reads_invariants_as_instructions():
    """It computes them per tile like any instruction, the same values: the generated code is
    the unmarked program's, but for the program quoted in its header."""
    marked = passes.hoist(ir.parse(BATCHNORM)).print()
    plain, hoisted = generate(BATCHNORM, "bn"), generate(marked, "bn")
    assert plain.ok and hoisted.ok, (plain.reason, hoisted.reason)

    assert _code(hoisted) == _code(plain)


# a layer norm's scale: rsqrt(var + eps) of each row's variance (eps the fp32 1e-5, as the
# rewriter prints it)
_NORM_SCALE = ("in0: f32[8,32]\n%0 = Mean in0 axes=[1]\n%1 = Sub in0, %0\n%2 = Square %1\n"
               "%3 = Mean %2 axes=[1]\n%4 = Add %3, 9.999999747378752e-06\n%5 = Rsqrt %4\n"
               "%6 = Mul %1, %5\nout0 = %6\n")


def test_widen_computes_the_rsqrt_of_a_reduced_sum_in_f64():
    widened = passes.widen(ir.parse(_NORM_SCALE))
    # the sum of two fp32 values is exact in f64: rsqrt of the exact sum, rounded once
    assert widened.print() == (
        "in0: f32[8,32]\n%0 = Mean in0 axes=[1]\n%1 = Sub in0, %0\n%2 = Square %1\n"
        "%3 = Mean %2 axes=[1]\n%4 = Cast %3 to=f64\n%5 = Add %4, 9.999999747378752e-06\n"
        "%6 = Rsqrt %5\n%7 = Cast %6 to=f32\n%8 = Mul %1, %7\nout0 = %8\n")
    assert passes.widen(widened) == widened
    assert passes.optimize(ir.parse(_NORM_SCALE)) == widened
    # the immediate is the fp32 constant the graph holds, read exactly as f64
    assert widened.instructions[5].operands[1] == float(np.float32(1e-5))
    # a backend without f64 gets TensorFlow's form back
    assert passes.narrow(widened).print() == _NORM_SCALE


@pytest.mark.parametrize("text, why", [
    ("in0: f32[8,32]\n%0 = Add in0, 9.999999747378752e-06\n%1 = Rsqrt %0\nout0 = %1\n",
     "one value an element: f64 arithmetic would cost"),
    (_NORM_SCALE.replace("f32", "f16"), "16-bit values: computed in fp32 and rounded to 16 bits"),
    (_NORM_SCALE.replace("f32", "f64"), "f64 already"),
    (_NORM_SCALE.replace("%4 = Add", "%4 = Mul"), "not a sum"),
])
def test_widen_leaves_alone(text, why):
    assert passes.widen(ir.parse(text)).print() == text, why


def test_widen_keeps_a_sum_read_elsewhere():
    text = _NORM_SCALE.replace("out0 = %6\n", "out0 = %6\nout1 = %4\n")
    widened = passes.widen(ir.parse(text))
    assert _ops(widened) == ["Mean", "Sub", "Square", "Mean", "Add", "Cast", "Add", "Rsqrt",
                             "Cast", "Mul"]
    assert widened.outputs == (ir.Val(9), ir.Val(4))


def test_the_ascend_generator_reads_a_widened_rsqrt_as_fp32():
    widened = passes.widen(ir.parse(_NORM_SCALE)).print()
    plain, wide = generate(_NORM_SCALE, "norm"), generate(widened, "norm")
    assert plain.ok and wide.ok, (plain.reason, wide.reason)

    assert _code(wide) == _code(plain)

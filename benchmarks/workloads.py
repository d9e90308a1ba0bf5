"""The suite's workloads: graph builders and their float64 numpy references.

Two kinds:

* micro: a TF1 graph run by a tf.compat.v1.Session. Every input is a resource variable
  initialised from seeded uniform data (so no feed is timed), and one step assigns the result
  to an output variable (the sink: a bare target would let XLA drop the unused result, and a
  fetch would time the copy to numpy). Checked against a float64 numpy reference.
* model: a Keras model (weights=None, seeded) called through tf.function on an input held
  in a tf.Variable, its output assigned to a tf.Variable. Checked against the reference
  mode's output of the same round (the parent compares the saved outputs).

`get(name, quick)` returns a workload; `resolve(spec)` expands a comma list with the group
names below. `chain@DIMxDIM:DTYPE` is abs -> relu -> exp on any shape (scripts/bench_chain.py).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable

DTYPES = ("float16", "bfloat16", "float32", "float64")
# Max of |out - ref| / (|ref| + 1e-3 * max|ref|) accepted, per output dtype: a few units in
# the last place for elementwise chains, more for sums over a few thousand values.
TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2, "float32": 1e-4, "float64": 1e-10}
# Models: max |out - ref| / max |ref| against the reference mode (XLA and the fused kernels
# evaluate the same expressions in another order, XLA with its own exp/tanh approximations).
MODEL_TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True)
class Input:
    name: str
    shape: tuple
    dtype: str
    low: float = -1.0
    high: float = 1.0

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * {"float16": 2, "bfloat16": 2, "float32": 4,
                                        "float64": 8}[self.dtype]


@dataclasses.dataclass(frozen=True)
class Micro:
    name: str
    title: str
    inputs: tuple            # of Input; the first is the data, the others parameters
    fn: Callable             # fn(tf, *tensors) -> output tensor
    reference: Callable      # reference(np, *float64 arrays) -> float64 array
    note: str = ""
    kind: str = "micro"

    @property
    def input_bytes(self) -> int:
        return sum(i.nbytes for i in self.inputs)

    @property
    def out_dtype(self) -> str:
        return self.inputs[0].dtype


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    title: str
    model: str               # resnet50, mobilenetv2, efficientnetb0, transformer
    batch: int
    quick: bool
    note: str = ""
    kind: str = "model"
    input_bytes: int = 0


# ----------------------------------------------------------------------------- micro graphs

def _chain(tf, x):
    return tf.exp(tf.nn.relu(tf.abs(x)))


def _chain_ref(np, x):
    return np.exp(np.maximum(np.abs(x), 0.0))


def _bias_relu(tf, x, b):
    return tf.nn.relu(tf.add(tf.abs(x), b))


def _bias_relu_ref(np, x, b):
    return np.maximum(np.abs(x) + b, 0.0)


def _abs_sum(tf, x):
    return tf.reduce_sum(tf.abs(x), axis=1)


def _abs_sum_ref(np, x):
    return np.abs(x).sum(axis=1)


def _gelu(tf, x):
    # tf.nn.gelu(approximate=True): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as ops
    return tf.nn.gelu(x, approximate=True)


def _gelu_ref(np, x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


LAYERNORM_EPS = 1e-3  # keras.layers.LayerNormalization's default epsilon


def _layernorm(tf, x, gamma, beta):
    # keras.ops.layer_normalization on the TensorFlow backend (Keras 3.15), axis -1
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    inv = tf.math.rsqrt(variance + LAYERNORM_EPS) * gamma
    res = -mean * inv + beta
    return x * inv + res


def _layernorm_ref(np, x, gamma, beta):
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + LAYERNORM_EPS) * gamma + beta


def _swish_bias(tf, x, b):
    z = x + b
    return z * tf.sigmoid(z)


def _swish_bias_ref(np, x, b):
    z = x + b
    return z / (1.0 + np.exp(-z))


def _softmax(tf, x):
    # exp(x - max) / sum, as ops: tf.nn.softmax is a single Softmax kernel already
    e = tf.exp(x - tf.reduce_max(x, axis=-1, keepdims=True))
    return e / tf.reduce_sum(e, axis=-1, keepdims=True)


def _softmax_ref(np, x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _lbl(shape) -> str:
    return f"[{','.join(map(str, shape))}]"


def _dims(text: str) -> tuple:
    return tuple(int(d) for d in text.split("x"))


def chain(shape: tuple, dtype: str, name: str | None = None) -> Micro:
    label = f"[{','.join(map(str, shape))}] {dtype}"
    return Micro(name or f"chain@{'x'.join(map(str, shape))}:{dtype}",
                 f"abs->relu->exp {label}", (Input("x", shape, dtype),), _chain, _chain_ref)


def _micro(name: str, quick: bool) -> Micro | None:
    q = quick
    if name == "ex_chain":
        return dataclasses.replace(chain((128, 192), "float16", "ex_chain"),
                                   title="example eleandele: abs->relu->exp [128,192] float16")
    if name == "ex_bias":
        return Micro(name, "example eleandbroadcast: abs, +[192], relu [128,192] float16",
                     (Input("x", (128, 192), "float16"), Input("b", (192,), "float16")),
                     _bias_relu, _bias_relu_ref)
    if name == "ex_reduce":
        return Micro(name, "example eleandreduce: abs, reduce_sum(axis=1) [128,192] float16",
                     (Input("x", (128, 192), "float16"),), _abs_sum, _abs_sum_ref)
    big = (256, 256) if q else (4096, 4096)
    if name in ("chain_f32", "chain_f16"):
        dtype = "float32" if name == "chain_f32" else "float16"
        return chain(big, dtype, name)
    if name == "bias_relu":
        return Micro(name, f"abs, +[{big[1]}] bias, relu {_lbl(big)} float32",
                     (Input("x", big, "float32"), Input("b", (big[1],), "float32")),
                     _bias_relu, _bias_relu_ref)
    if name == "abs_sum":
        return Micro(name, f"abs, reduce_sum(axis=1) {_lbl(big)} float32",
                     (Input("x", big, "float32"),), _abs_sum, _abs_sum_ref)
    if name == "gelu":
        shape = (256, 384) if q else (8192, 3072)
        return Micro(name, f"GELU, tanh form {_lbl(shape)} float32",
                     (Input("x", shape, "float32", -3.0, 3.0),), _gelu, _gelu_ref,
                     note="tf.nn.gelu(approximate=True): Pow, Mul, AddV2, Tanh, ... as ops")
    if name == "layernorm":
        shape = (512, 768) if q else (16384, 768)
        return Micro(name, f"LayerNorm (Keras' formula) {_lbl(shape)} float32",
                     (Input("x", shape, "float32", -2.0, 2.0),
                      Input("gamma", (shape[1],), "float32", 0.5, 1.5),
                      Input("beta", (shape[1],), "float32")),
                     _layernorm, _layernorm_ref,
                     note="tf.nn.moments over the last axis, rsqrt(var + eps) * gamma, "
                          "x * inv + (beta - mean * inv), as keras.ops.layer_normalization")
    if name == "swish_bias":
        return Micro(name, f"swish(x + [{big[1]}] bias) {_lbl(big)} float32",
                     (Input("x", big, "float32", -3.0, 3.0), Input("b", (big[1],), "float32")),
                     _swish_bias, _swish_bias_ref)
    if name == "softmax":
        return Micro(name, f"softmax as exp(x - max) / sum {_lbl(big)} float32",
                     (Input("x", big, "float32", -3.0, 3.0),), _softmax, _softmax_ref,
                     note="spelled out as ops: TensorFlow's own Softmax op is one kernel already")
    match = re.fullmatch(r"chain@(\d+(?:x\d+)*):(\w+)", name)
    if match and match.group(2) in DTYPES:
        return chain(_dims(match.group(1)), match.group(2))
    return None


# ----------------------------------------------------------------------------- models

MODEL_NAMES = {"resnet50": "Keras ResNet50", "mobilenetv2": "Keras MobileNetV2",
               "efficientnetb0": "Keras EfficientNetB0",
               "transformer": "2-layer transformer encoder"}


def _model(name: str, quick: bool) -> Model | None:
    match = re.fullmatch(r"(resnet50|mobilenetv2|efficientnetb0|transformer)_b(\d+)", name)
    if not match:
        return None
    model, batch = match.group(1), int(match.group(2))
    size = model_input_shape(model, quick)
    title = f"{MODEL_NAMES[model]} batch {batch}, input {_lbl(size)}"
    note = ("tf.function(model(x, training=False)), weights=None, "
            "keras.utils.set_random_seed(0)"
            + ("" if model == "transformer" else ", classifier_activation=None (logits)"))
    return Model(name, title, model, batch, quick, note,
                 input_bytes=4 * batch * math.prod(size))


def model_input_shape(model: str, quick: bool) -> tuple:
    if model == "transformer":
        return (16, 32) if quick else (128, 256)
    return (32, 32, 3) if quick else (224, 224, 3)


def transformer_encoder(keras, layers=2, seq=128, width=256, heads=4, ffn=1024):
    """The 2-layer encoder of the suite and of tests/test_models.py: MultiHeadAttention, residual + LayerNormalization,
    Dense(ffn, gelu) -> Dense(width) FFN, residual + LayerNormalization."""
    inputs = keras.Input(shape=(seq, width))
    x = inputs
    for _ in range(layers):
        attention = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=width // heads)(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-6)(x + attention)
        hidden = keras.layers.Dense(ffn, activation="gelu")(x)
        x = keras.layers.LayerNormalization(epsilon=1e-6)(x + keras.layers.Dense(width)(hidden))
    return keras.Model(inputs, x)


def build_model(workload: Model):
    """The seeded Keras model (weights=None) of a model workload."""
    import keras

    keras.utils.set_random_seed(0)
    shape = model_input_shape(workload.model, workload.quick)
    # Logits (classifier_activation=None): with weights=None the MobileNetV2 and EfficientNetB0
    # softmax outputs are 0.001 everywhere, which no kernel change could move; the logits are
    # small (1e-8 to 1e-11) but spread, and the value check is relative to their largest.
    if workload.model == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=shape,
                                           classifier_activation=None)
    if workload.model == "mobilenetv2":
        return keras.applications.MobileNetV2(weights=None, input_shape=shape,
                                              classifier_activation=None)
    if workload.model == "efficientnetb0":
        return keras.applications.EfficientNetB0(weights=None, input_shape=shape,
                                                 classifier_activation=None)
    seq, width = shape
    if workload.quick:
        return transformer_encoder(keras, seq=seq, width=width, heads=2, ffn=64)
    return transformer_encoder(keras, seq=seq, width=width)


# ----------------------------------------------------------------------------- registry

EXAMPLES = ["ex_chain", "ex_bias", "ex_reduce"]
MICRO = EXAMPLES + ["chain_f32", "chain_f16", "bias_relu", "abs_sum", "gelu", "layernorm",
                    "swish_bias", "softmax"]
MODELS = [f"{m}_b{b}" for m in ("resnet50", "mobilenetv2", "efficientnetb0", "transformer")
          for b in (1, 8)]
GROUPS = {"examples": EXAMPLES, "micro": MICRO, "models": MODELS, "all": MICRO + MODELS}


def get(name: str, quick: bool = False):
    """The workload called `name` (quick: the CI sizes), or KeyError."""
    workload = _micro(name, quick) or _model(name, quick)
    if workload is None:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(GROUPS['all'])}, groups "
                       f"{', '.join(GROUPS)}, or chain@DIMxDIM:DTYPE")
    return workload


def resolve(names: list[str]) -> list[str]:
    """Expand group names; keep order, drop repeats; KeyError on an unknown name."""
    out: list[str] = []
    for name in names:
        for item in GROUPS.get(name, [name]):
            get(item)  # validates
            if item not in out:
                out.append(item)
    return out

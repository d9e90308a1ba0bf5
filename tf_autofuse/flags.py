"""The two flag strings users set: AUTOFUSE_FLAGS and AUTOFUSE_DFX_FLAGS.

Both are `--key=value` items separated by `;`, e.g.
`AUTOFUSE_FLAGS="--enable_autofuse=true;--max_fusion_size=32"`.
Every key is declared once in `_SPECS` below, with its parser, default and help; an
unknown key, a repeated key, an empty or malformed value is a `FlagError` that names the
key and what it accepts. Nothing falls back to a default silently.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Mapping, Optional

from .rewriter.partition import Policy

FLAGS_ENV = "AUTOFUSE_FLAGS"
DFX_FLAGS_ENV = "AUTOFUSE_DFX_FLAGS"


class FlagError(ValueError):
    """A flag string that cannot be read. The message names the variable and the key."""


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ValueError


def _parse_count(text: str) -> int:
    text = text.strip()
    if not text.isdigit():
        raise ValueError
    return int(text)


def _parse_path(text: str) -> str:
    if not text.strip():
        raise ValueError
    return text.strip()


# pointwise: the elementwise partitioner; reduce: reductions in its groups; epilogue: biases and
# activations after convolutions and MatMuls run by TensorFlow's fused kernels; epilogue_scale:
# per-channel scales too (BatchNormalization), folded into the filter where it is the smaller;
# assign: variable writes of fused outputs carried out by their kernel (rewriter/assigns.py)
PASSES = ("pointwise", "reduce", "epilogue", "epilogue_scale", "assign")
ON_BY_DEFAULT = ("pointwise", "epilogue", "epilogue_scale", "assign")


def _parse_passes(text: str) -> tuple:
    names = [part.strip() for part in text.split(",")]
    if not names or any(name not in PASSES for name in names) or len(set(names)) != len(names):
        raise ValueError
    return tuple(names)


def _parse_op_list(text: str) -> frozenset:
    """Op names of the fused-program IR (the catalog's `ir_name`s) or TF op types that lower to
    one of them (AddV2 -> Add, RealDiv -> Div): the IR names."""
    from .rewriter import catalog  # imports TensorFlow's protos: only when the flag is given

    names = [part.strip() for part in text.split(",")]
    ops = set()
    for name in names:
        spec = catalog.for_ir_name(name) or catalog.for_tf_op(name)
        if not name or spec is None:
            raise ValueError(f"unknown op {name!r}")
        ops.add(spec.ir_name)
    return frozenset(ops)


def _op_names() -> str:
    from .rewriter import catalog

    return ", ".join(sorted({spec.ir_name for spec in catalog.OPS}))


COST_MODELS = ("none", "memory_bandwidth", "compute_density", "latency")


def _parse_cost_model(text: str) -> str:
    name = text.strip()
    if name not in COST_MODELS:
        raise ValueError
    return name


def _parse_positive(text: str) -> int:
    value = _parse_count(text)
    if value < 1:
        raise ValueError
    return value


@dataclasses.dataclass(frozen=True)
class SkipList:
    """--skip_node_names_cfg: nodes never fused, by name and by op type."""

    path: str
    names: frozenset = frozenset()
    types: frozenset = frozenset()


SKIP_SECTIONS = {"ByNodeName": "names", "ByNodeType": "types"}


def read_skip_list(path: str, source: str = DFX_FLAGS_ENV) -> SkipList:
    """Read the ini file of --skip_node_names_cfg: `[ByNodeName]` and `[ByNodeType]` sections,
    one entry a line; blank lines and lines starting with '#' or ';' are ignored."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise FlagError(f"{source}: --skip_node_names_cfg={path}: cannot read the file "
                        f"({err.__class__.__name__}: {err})") from None
    entries = {"names": set(), "types": set()}
    section = None
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            name = line[1:-1].strip()
            if name not in SKIP_SECTIONS:
                raise FlagError(
                    f"{source}: --skip_node_names_cfg={path}: line {number}: unknown section "
                    f"[{name}]; accepted sections: [ByNodeName], [ByNodeType]")
            section = SKIP_SECTIONS[name]
            continue
        if section is None:
            raise FlagError(
                f"{source}: --skip_node_names_cfg={path}: line {number}: {line!r} comes before "
                "any section ([ByNodeName] or [ByNodeType])")
        entries[section].add(line)
    return SkipList(path, frozenset(entries["names"]), frozenset(entries["types"]))


@dataclasses.dataclass(frozen=True)
class _Spec:
    env: str
    parse: Callable[[str], object]
    accepted: object  # str, or a function giving it (for lists read from the op table)
    default: object
    help: str

    def accepts(self) -> str:
        return self.accepted() if callable(self.accepted) else self.accepted


_POLICY = Policy()  # the fusion limits' defaults are the partitioner's (rewriter/partition.py)

_SPECS: dict[str, _Spec] = {
    "enable_autofuse": _Spec(
        FLAGS_ENV, _parse_bool, "true or false", False,
        "turn fusion on for every graph in the process"),
    "max_fusion_size": _Spec(
        FLAGS_ENV, _parse_count, "an integer >= 0", _POLICY.max_fusion_size,
        "most compute ops in one fused kernel; 0 turns fusion off"),
    "codegen_compile_debug": _Spec(
        DFX_FLAGS_ENV, _parse_bool, "true or false", False,
        "dump each graph before and after the pass, and every fused program, into --debug_dir"),
    "debug_dir": _Spec(
        DFX_FLAGS_ENV, _parse_path, "a directory path", "autofuse_debug",
        "where --codegen_compile_debug writes its files"),
    "autofuse_enable_pass": _Spec(
        FLAGS_ENV, _parse_passes, "a comma-separated list of " + ", ".join(PASSES), (),
        "fusion passes to turn on (reduce is off by default)"),
    "autofuse_disable_pass": _Spec(
        FLAGS_ENV, _parse_passes, "a comma-separated list of " + ", ".join(PASSES), (),
        "fusion passes to turn off (disabling pointwise turns all elementwise fusion off)"),
    "recomputation_threshold": _Spec(
        FLAGS_ENV, _parse_count, "an integer >= 0", _POLICY.recomputation_threshold,
        "most compute ops a fused kernel recomputes instead of reading another kernel's "
        "extra output; 0 never recomputes"),
    "max_input_nums_after_fuse": _Spec(
        FLAGS_ENV, _parse_positive, "an integer >= 1", _POLICY.max_inputs,
        "most distinct inputs of one fused kernel"),
    "cost_model": _Spec(
        FLAGS_ENV, _parse_cost_model, "one of " + ", ".join(COST_MODELS), "none",
        "the partitioner's cost model (docs/API.md, cost models); none fuses whatever the "
        "limits allow"),
    "kernel_profile": _Spec(
        DFX_FLAGS_ENV, _parse_path, "a file path", None,
        "time every step of every fused kernel built afterwards and write a CSV there at "
        "process exit (process-wide, read at import)"),
    "strip_fusion": _Spec(
        DFX_FLAGS_ENV, _parse_bool, "true or false", True,
        "run consecutive fp32 elementwise steps of a fused kernel strip by strip (256 elements) "
        "instead of each over a whole tile; false is for measuring what that brings "
        "(process-wide, read at import)"),
    "split_reductions": _Spec(
        DFX_FLAGS_ENV, _parse_bool, "true or false", True,
        "cut the reduced axes of a reduction with few work items (BatchNorm's statistics) into "
        "blocks so that it runs on every core; false is for measuring what that brings "
        "(process-wide, read at import; results are the same bits for any thread count either "
        "way, but differ between the two settings)"),
    "output_cache_mb": _Spec(
        FLAGS_ENV, _parse_count, "an integer >= 0 (MiB)", 1024,
        "most MiB of freed fused-kernel outputs (each of 4 MiB or more) kept for reuse by the "
        "next step's outputs, which then skip the OS zero-filling new pages; 0 turns the cache "
        "off (process-wide, read at import)"),
    "skip_node_names_cfg": _Spec(
        DFX_FLAGS_ENV, _parse_path, "the path of an ini file with [ByNodeName] and "
        "[ByNodeType] sections", None,
        "nodes never fused, by name and by op type"),
    "autofuse_enhance_precision_blacklist": _Spec(
        FLAGS_ENV, _parse_op_list,
        lambda: "a comma-separated list of op names (or TF op types) from: " + _op_names(),
        frozenset(),
        "ops whose 16-bit inputs the generated NPU kernels do not cast to fp32 (f16 computed "
        "in half); the CPU kernel is unaffected"),
}


# Keys read once, at import, for the whole process (the kernel library's state).
PROCESS_WIDE = frozenset({"kernel_profile", "output_cache_mb", "strip_fusion", "split_reductions"})


def _default(key: str):
    return _SPECS[key].default


@dataclasses.dataclass(frozen=True)
class Flags:
    """The flags in force: one field a key of `_SPECS`, whose default it takes."""

    enable_autofuse: bool = _default("enable_autofuse")
    max_fusion_size: int = _default("max_fusion_size")
    codegen_compile_debug: bool = _default("codegen_compile_debug")
    debug_dir: str = _default("debug_dir")
    autofuse_enable_pass: tuple = _default("autofuse_enable_pass")
    autofuse_disable_pass: tuple = _default("autofuse_disable_pass")
    recomputation_threshold: int = _default("recomputation_threshold")
    max_input_nums_after_fuse: int = _default("max_input_nums_after_fuse")
    skip_node_names_cfg: Optional[SkipList] = _default("skip_node_names_cfg")
    kernel_profile: Optional[str] = _default("kernel_profile")
    strip_fusion: bool = _default("strip_fusion")
    split_reductions: bool = _default("split_reductions")
    autofuse_enhance_precision_blacklist: frozenset = _default(
        "autofuse_enhance_precision_blacklist")
    cost_model: str = _default("cost_model")
    output_cache_mb: int = _default("output_cache_mb")

    def with_overrides(self, overrides: Mapping[str, str], source: str) -> "Flags":
        """Flags with `overrides` (key -> text value, as a ConfigProto parameter_map gives them)."""
        values = {}
        for key, text in overrides.items():
            spec = _spec_for(key, source)
            if key in PROCESS_WIDE:
                raise FlagError(f"{source}: --{key} is process-wide, not per graph: set it in "
                                f"{spec.env} before importing tf_autofuse")
            values[key] = _finish(key, _parse_value(key, text, spec, source), source)
        _check_passes(values.get("autofuse_enable_pass", self.autofuse_enable_pass),
                      values.get("autofuse_disable_pass", self.autofuse_disable_pass), source)
        return dataclasses.replace(self, **values)

    def pass_enabled(self, name: str) -> bool:
        """pointwise, epilogue, epilogue_scale, assign: unless disabled; reduce: when enabled
        and not disabled."""
        if name in self.autofuse_disable_pass:
            return False
        return name in ON_BY_DEFAULT or name in self.autofuse_enable_pass


assert {f.name for f in dataclasses.fields(Flags)} == set(_SPECS), "Flags and _SPECS disagree"


def _finish(key: str, value, source: str):
    """Values that need more than parsing: the skip list is read from its file."""
    if key == "skip_node_names_cfg":
        return read_skip_list(value, source)
    return value


def _check_passes(enable, disable, source: str) -> None:
    both = sorted(set(enable) & set(disable))
    if both:
        raise FlagError(f"{source}: --autofuse_enable_pass and --autofuse_disable_pass both "
                        f"name {', '.join(both)}; name a pass in one of them")


def describe() -> str:
    """One line a flag, for error messages and the README."""
    lines = []
    for key, spec in _SPECS.items():
        lines.append(f"  {spec.env}: --{key}=<{spec.accepts()}> (default {spec.default!r}): {spec.help}")
    return "\n".join(lines)


def _spec_for(key: str, source: str) -> _Spec:
    spec = _SPECS.get(key)
    if spec is None:
        known = ", ".join(f"--{k}" for k in _SPECS)
        raise FlagError(f"{source}: unknown key --{key}; known keys: {known}")
    return spec


def _parse_value(key: str, text: str, spec: _Spec, source: str) -> object:
    if text is None or not str(text).strip():
        raise FlagError(f"{source}: --{key} has an empty value; it accepts {spec.accepts()}")
    try:
        return spec.parse(str(text))
    except ValueError as err:
        detail = f" ({err})" if str(err) else ""
        raise FlagError(
            f"{source}: --{key}={text!r} is not valid{detail}; it accepts {spec.accepts()}") from None


def parse_items(text: str, env: str) -> dict[str, object]:
    """Parse one flag string of variable `env` into {key: value}."""
    values: dict[str, object] = {}
    for raw in text.split(";"):
        item = raw.strip()
        if not item:
            continue
        if not item.startswith("--") or "=" not in item:
            raise FlagError(
                f"{env}: {item!r} is not of the form --key=value (items are separated by ';')")
        key, _, value = item[2:].partition("=")
        key = key.strip()
        spec = _spec_for(key, env)
        if spec.env != env:
            raise FlagError(f"{env}: --{key} belongs in {spec.env}, not {env}")
        if key in values:
            raise FlagError(f"{env}: --{key} is given more than once")
        values[key] = _finish(key, _parse_value(key, value, spec, env), env)
    return values


def from_env(environ: Mapping[str, str] | None = None) -> Flags:
    """Read AUTOFUSE_FLAGS and AUTOFUSE_DFX_FLAGS. Raises FlagError on any bad item."""
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for env in (FLAGS_ENV, DFX_FLAGS_ENV):
        values.update(parse_items(environ.get(env, ""), env))
    _check_passes(values.get("autofuse_enable_pass", ()), values.get("autofuse_disable_pass", ()),
                  FLAGS_ENV)
    return Flags(**values)

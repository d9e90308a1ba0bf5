"""AUTOFUSE_FLAGS / AUTOFUSE_DFX_FLAGS: values users set, and every way of getting them wrong."""

import subprocess
import sys

import pytest

from tf_autofuse import flags
from tf_autofuse.flags import FlagError, Flags


def read(main="", dfx=""):
    return flags.from_env({"AUTOFUSE_FLAGS": main, "AUTOFUSE_DFX_FLAGS": dfx})


def test_defaults_when_unset():
    assert flags.from_env({}) == Flags(enable_autofuse=False, max_fusion_size=64,
                                       codegen_compile_debug=False, debug_dir="autofuse_debug")


def test_values_are_read():
    got = read("--enable_autofuse=true;--max_fusion_size=8",
               "--codegen_compile_debug=true;--debug_dir=/tmp/x")
    assert got == Flags(True, 8, True, "/tmp/x")


@pytest.mark.parametrize("text", ["true", "TRUE", "1", "True"])
def test_true_spellings(text):
    assert read(f"--enable_autofuse={text}").enable_autofuse is True


def test_trailing_separator_and_spaces_are_fine():
    assert read(" --enable_autofuse=true ; --max_fusion_size=3 ;").max_fusion_size == 3


def test_zero_fusion_size_is_allowed():
    assert read("--max_fusion_size=0").max_fusion_size == 0


@pytest.mark.parametrize("main,dfx,words", [
    ("--enable_autofuse=yes", "", ["--enable_autofuse", "true or false"]),
    ("--enable_autofuse=", "", ["--enable_autofuse", "empty"]),
    ("--max_fusion_size=-1", "", ["--max_fusion_size", "integer >= 0"]),
    ("--max_fusion_size=big", "", ["--max_fusion_size", "integer >= 0"]),
    ("--enable_autofuze=true", "", ["--enable_autofuze", "unknown", "--enable_autofuse"]),
    ("--enable_autofuse=true;--enable_autofuse=false", "", ["--enable_autofuse", "more than once"]),
    ("enable_autofuse=true", "", ["--key=value"]),
    ("--enable_autofuse", "", ["--key=value"]),
    ("--debug_dir=/tmp", "", ["--debug_dir", "AUTOFUSE_DFX_FLAGS"]),
    ("", "--codegen_compile_debug=maybe", ["--codegen_compile_debug", "true or false"]),
])
def test_bad_flags_name_the_key(main, dfx, words):
    with pytest.raises(FlagError) as err:
        read(main, dfx)
    for word in words:
        assert word in str(err.value)


def test_parameter_map_overrides():
    base = Flags(enable_autofuse=False, max_fusion_size=64)
    assert base.with_overrides({"max_fusion_size": "2"}, "params").max_fusion_size == 2
    with pytest.raises(FlagError, match="--max_fusion_size"):
        base.with_overrides({"max_fusion_size": "two"}, "params")
    with pytest.raises(FlagError, match="--nope"):
        base.with_overrides({"nope": "1"}, "params")


def test_process_wide_flags_are_refused_per_graph():
    assert read("--output_cache_mb=0", "").output_cache_mb == 0
    assert Flags().output_cache_mb == 1024
    for key, value in (("output_cache_mb", "0"), ("kernel_profile", "kp.csv")):
        with pytest.raises(FlagError, match=f"--{key} is process-wide"):
            Flags().with_overrides({key: value}, "params")
    with pytest.raises(FlagError, match="--output_cache_mb"):
        read("--output_cache_mb=-1", "")


def test_bad_flag_stops_the_import_naming_the_key():
    env = {"AUTOFUSE_FLAGS": "--enable_autofuse=perhaps", "PATH": "/usr/bin:/bin",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", "import tf_autofuse"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "FlagError" in proc.stderr
    assert "--enable_autofuse='perhaps' is not valid; it accepts true or false" in proc.stderr


# --- issue 3 flags ---------------------------------------------------------------------------


def test_new_defaults():
    got = flags.from_env({})
    assert got.autofuse_enable_pass == () and got.autofuse_disable_pass == ()
    assert got.recomputation_threshold == 0 and got.max_input_nums_after_fuse == 8
    assert got.skip_node_names_cfg is None
    assert got.pass_enabled("pointwise") and not got.pass_enabled("reduce")


def test_pass_lists():
    got = read("--autofuse_enable_pass=reduce;--recomputation_threshold=3;"
               "--max_input_nums_after_fuse=12")
    assert got.autofuse_enable_pass == ("reduce",) and got.pass_enabled("reduce")
    assert got.recomputation_threshold == 3 and got.max_input_nums_after_fuse == 12
    got = read("--autofuse_disable_pass=pointwise")
    assert not got.pass_enabled("pointwise")
    assert read("--autofuse_enable_pass=pointwise,reduce").autofuse_enable_pass == (
        "pointwise", "reduce")


@pytest.mark.parametrize("main,words", [
    ("--autofuse_enable_pass=fancy", ["--autofuse_enable_pass", "pointwise, reduce"]),
    ("--autofuse_enable_pass=reduce,reduce", ["--autofuse_enable_pass", "pointwise, reduce"]),
    ("--autofuse_enable_pass=", ["--autofuse_enable_pass", "empty"]),
    ("--autofuse_disable_pass=reduce,", ["--autofuse_disable_pass", "pointwise, reduce"]),
    ("--autofuse_enable_pass=reduce;--autofuse_disable_pass=reduce",
     ["--autofuse_enable_pass", "--autofuse_disable_pass", "reduce"]),
    ("--autofuse_enable_pass=reduce;--autofuse_enable_pass=reduce",
     ["--autofuse_enable_pass", "more than once"]),
    ("--recomputation_threshold=-2", ["--recomputation_threshold", "integer >= 0"]),
    ("--recomputation_threshold=few", ["--recomputation_threshold", "integer >= 0"]),
    ("--max_input_nums_after_fuse=0", ["--max_input_nums_after_fuse", "integer >= 1"]),
    ("--max_input_nums_after_fuse=", ["--max_input_nums_after_fuse", "empty"]),
    ("--skip_node_names_cfg=/tmp/x.ini", ["--skip_node_names_cfg", "AUTOFUSE_DFX_FLAGS"]),
])
def test_bad_pass_limit_and_skip_flags_name_the_key(main, words):
    with pytest.raises(FlagError) as err:
        read(main)
    for word in words:
        assert word in str(err.value)


def test_skip_cfg_file(tmp_path):
    cfg = tmp_path / "skip.ini"
    cfg.write_text("# nodes to leave alone\n[ByNodeName]\nblock1/relu\n\nhead/Exp\n"
                   "[ByNodeType]\nSigmoid\n")
    got = read(dfx=f"--skip_node_names_cfg={cfg}").skip_node_names_cfg
    assert got.names == {"block1/relu", "head/Exp"} and got.types == {"Sigmoid"}
    assert got.path == str(cfg)


def test_skip_cfg_errors_name_the_flag_and_the_file(tmp_path):
    missing = tmp_path / "missing.ini"
    with pytest.raises(FlagError) as err:
        read(dfx=f"--skip_node_names_cfg={missing}")
    assert "--skip_node_names_cfg" in str(err.value) and str(missing) in str(err.value)
    bad = tmp_path / "bad.ini"
    bad.write_text("[ByNodeName]\na\n[ByColour]\nred\n")
    with pytest.raises(FlagError) as err:
        read(dfx=f"--skip_node_names_cfg={bad}")
    assert "--skip_node_names_cfg" in str(err.value) and str(bad) in str(err.value)
    assert "[ByColour]" in str(err.value)
    orphan = tmp_path / "orphan.ini"
    orphan.write_text("relu\n")
    with pytest.raises(FlagError, match="before any section"):
        read(dfx=f"--skip_node_names_cfg={orphan}")
    with pytest.raises(FlagError, match="--skip_node_names_cfg"):
        read(dfx="--skip_node_names_cfg=")


def test_parameter_map_overrides_passes_limits_and_the_skip_list(tmp_path):
    cfg = tmp_path / "skip.ini"
    cfg.write_text("[ByNodeType]\nExp\n")
    got = Flags().with_overrides({"autofuse_enable_pass": "reduce",
                                  "max_input_nums_after_fuse": "4",
                                  "skip_node_names_cfg": str(cfg)}, "params")
    assert got.pass_enabled("reduce") and got.max_input_nums_after_fuse == 4
    assert got.skip_node_names_cfg.types == {"Exp"}
    with pytest.raises(FlagError, match="--autofuse_disable_pass"):
        got.with_overrides({"autofuse_disable_pass": "reduce"}, "params")
    with pytest.raises(FlagError, match="--recomputation_threshold"):
        Flags().with_overrides({"recomputation_threshold": "x"}, "params")


def test_rewriter_reads_the_flags_object():
    from tf_autofuse import rewriter

    policy = rewriter.policy_from_flags(read("--autofuse_enable_pass=reduce;"
                                             "--recomputation_threshold=2;"
                                             "--max_input_nums_after_fuse=5"))
    assert policy.reduce and policy.pointwise
    assert policy.recomputation_threshold == 2 and policy.max_inputs == 5
    assert not rewriter.policy_from_flags(read("--autofuse_disable_pass=pointwise")).pointwise


# --- issue 6: the precision blacklist of the NPU code generator -------------------------------


def test_precision_blacklist_default_and_values():
    assert flags.from_env({}).autofuse_enhance_precision_blacklist == frozenset()
    got = read("--autofuse_enhance_precision_blacklist=Exp, Mul,Exp")
    assert got.autofuse_enhance_precision_blacklist == {"Exp", "Mul"}
    # TF op types are read as the IR op they lower to
    got = read("--autofuse_enhance_precision_blacklist=AddV2,RealDiv,Sqrt")
    assert got.autofuse_enhance_precision_blacklist == {"Add", "Div", "Sqrt"}
    params = Flags().with_overrides({"autofuse_enhance_precision_blacklist": "Tanh"}, "params")
    assert params.autofuse_enhance_precision_blacklist == {"Tanh"}


@pytest.mark.parametrize("main,words", [
    ("--autofuse_enhance_precision_blacklist=Exp,Frobnicate",
     ["--autofuse_enhance_precision_blacklist", "'Frobnicate'", "accepts", "Exp", "Mul", "Sigmoid"]),
    ("--autofuse_enhance_precision_blacklist=Exp,", ["--autofuse_enhance_precision_blacklist", "''"]),
    ("--autofuse_enhance_precision_blacklist=", ["--autofuse_enhance_precision_blacklist", "empty"]),
    ("--autofuse_enhance_precision_blacklist=exp", ["unknown op 'exp'"]),
])
def test_bad_precision_blacklist_names_the_key_and_the_ops(main, words):
    with pytest.raises(FlagError) as err:
        read(main)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_precision_blacklist_belongs_in_autofuse_flags():
    with pytest.raises(FlagError, match="belongs in AUTOFUSE_FLAGS"):
        read(dfx="--autofuse_enhance_precision_blacklist=Exp")

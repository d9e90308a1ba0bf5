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


def test_bad_flag_stops_the_import_naming_the_key():
    env = {"AUTOFUSE_FLAGS": "--enable_autofuse=perhaps", "PATH": "/usr/bin:/bin",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", "import tf_autofuse"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "FlagError" in proc.stderr
    assert "--enable_autofuse='perhaps' is not valid; it accepts true or false" in proc.stderr

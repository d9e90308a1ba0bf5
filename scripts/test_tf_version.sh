#!/usr/bin/env bash
# One TensorFlow release, as a user installs it: a fresh virtual environment with
# tensorflow-cpu==VERSION, then `pip install .` over it. Checks that the install left that
# TensorFlow the only one, then, with no compiler usable (CXX=false, an empty kernel cache), that
# the three examples fuse in both modes and the focused tests pass: the examples, a tf.function
# and a Keras model through the plugin path, the Python API, the epilogues TensorFlow's fused
# kernels of that release take.
#
#   scripts/test_tf_version.sh 2.15.1 [VENV_DIR]      (default VENV_DIR: .cache/venv-tf-VERSION)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VERSION=${1:?usage: scripts/test_tf_version.sh VERSION [VENV_DIR]}
VENV=${2:-$ROOT/.cache/venv-tf-$VERSION}
PYTHON=${PYTHON:-python3}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# The wheels come from the package registry: a download cut short fails pip's hash check, and a
# second attempt fetches it again (three attempts, then the failure stands).
for attempt in 1 2 3; do
  "${PIP[@]}" install "tensorflow-cpu==$VERSION" pytest hypothesis mpmath && break
  [ "$attempt" = 3 ] && exit 1
  echo "pip install failed (attempt $attempt of 3), trying again" >&2
done
before=$("${PIP[@]}" list --format=freeze | sort)
"${PIP[@]}" install "$ROOT"
after=$("${PIP[@]}" list --format=freeze | sort)
changed=$(comm -13 <(echo "$before") <(echo "$after") | grep -v -i '^tf.autofuse==' || true)
if [ -n "$changed" ]; then
  echo "FAIL: installing tf_autofuse changed other packages:" >&2
  echo "$changed" >&2
  exit 1
fi
# the distributions installing the `tensorflow` package, names normalised (PEP 503)
providers=$("$VENV/bin/python" -c "
import importlib.metadata as m, re
names = m.packages_distributions().get('tensorflow', [])
print(' '.join(sorted({re.sub(r'[-_.]+', '-', n).lower() for n in names})))")
if [ "$providers" != "tensorflow-cpu" ]; then
  echo "FAIL: the tensorflow package is provided by: ${providers:-nothing}" >&2; exit 1
fi
echo "tensorflow-cpu $VERSION is the only TensorFlow after the install"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Outside the source tree, so that the installed package is the one imported.
export CXX=false TF_AUTOFUSE_CACHE_DIR=$work/empty-cache TF_CPP_MIN_LOG_LEVEL=2
unset PYTHONPATH
cd "$work"
"$VENV/bin/python" -m tf_autofuse doctor
for example in "$ROOT"/examples/tensorflow/af_tf_*/test_*.py; do
  for mode in tf1 tf2-compat; do
    name="$(basename "$example") --mode $mode"
    out=$(AUTOFUSE_FLAGS="--enable_autofuse=true;--autofuse_enable_pass=reduce" \
          "$VENV/bin/python" "$example" --mode "$mode" \
          --steps 3 2>&1)
    # a here-string, not a pipe: grep -q exits at the first match, and under pipefail the
    # echo feeding it would die of SIGPIPE and fail the check
    if ! grep -q "AutofuseKernel *autofuse_" <<< "$out"; then
      echo "FAIL: $name ran no fused kernel:" >&2; echo "$out" >&2; exit 1
    fi
    echo "fused: $name: $(echo "$out" | grep -o 'autofuse_[a-z]*_[0-9][A-Za-z0-9_]*' | sort -u | tr '\n' ' ')"
  done
done
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/tests/test_plugin.py" "$ROOT/tests/test_api.py" \
  "$ROOT/tests/test_epilogue.py"

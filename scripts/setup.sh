#!/usr/bin/env bash
# Set up a fresh machine for development: a C++ compiler, TensorFlow when none is installed,
# then tf_autofuse (editable) with the test tools. Safe to run again: it installs only what is
# missing. tf_autofuse never installs or replaces a TensorFlow itself; this script installs
# $TF_REQUIREMENT (default tensorflow==2.21.*) only where Python finds no tensorflow package.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if ! command -v "${CXX:-g++}" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq g++ >/dev/null
  else
    echo "tf_autofuse needs a C++17 compiler (g++): install it, e.g. 'sudo apt-get install g++'" >&2
    exit 1
  fi
fi
if ! "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('tensorflow') is None)"; then
  "$PYTHON" -m pip install --quiet --disable-pip-version-check "${TF_REQUIREMENT:-tensorflow==2.21.*}"
fi
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".[test]"
# An editable install builds on import: build (or find in the cache) the kernel library now
# rather than inside the first test.
"$PYTHON" -c "from tf_autofuse import _build; print(_build.library_path())"

#!/usr/bin/env bash
# Set up a fresh machine: a C++ compiler, then tf_autofuse with TensorFlow and the test tools.
# Safe to run again: it installs only what is missing.
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
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".[test]"
# Build (or find in the cache) the kernel library now rather than inside the first test.
"$PYTHON" -c "from tf_autofuse import _build; print(_build.library_path())"

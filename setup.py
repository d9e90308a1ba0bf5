"""tf_autofuse: automatic operator fusion for TensorFlow.

The C++ part (op, CPU kernel, Grappler bridge) ships as source and is built against the
installed TensorFlow on first import (see tf_autofuse/_build.py), so one package serves any
machine with a C++17 compiler.
"""

from setuptools import find_packages, setup

setup(
    name="tf_autofuse",
    version="0.1.0",
    description="Automatic fusion of memory-bound operator chains for TensorFlow",
    packages=find_packages(include=["tf_autofuse", "tf_autofuse.*"]),
    package_data={"tf_autofuse": ["cc/*.cc", "cc/*.h", "cc/cpu/*.h", "codegen/twin/*.h", "codegen/twin/*.cpp",
                                  "codegen/twin/acl/*.h", "codegen/host/*.h"]},
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.21,<2.22",
        "numpy",
        "protobuf",
    ],
    extras_require={"test": ["pytest", "hypothesis", "mpmath"]},
)

"""tf_autofuse: automatic operator fusion for TensorFlow.

Installing builds the C++ library (op, CPU kernel, Grappler bridge) against the TensorFlow
already installed in the target environment (tf_autofuse/_build.py, build_for_install), so
importing needs no compiler. TensorFlow itself is not a requirement pip could act on: any
distribution providing the `tensorflow` package (tensorflow, tensorflow-cpu, tensorflow-intel,
...) in the supported range serves, and the install never adds or replaces one. The C++ sources
ship too: a TensorFlow changed after the install is built for on first import.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent


def _build_module():
    # By path: importing the package would import TensorFlow, which the build environment hides.
    spec = importlib.util.spec_from_file_location("tf_autofuse_build",
                                                  HERE / "tf_autofuse" / "_build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class BuildPyWithKernels(build_py):
    """Copies the package, then compiles the kernel libraries into its _lib/ folder. An editable
    install builds on import instead: its sources change under it."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        # from the copy that ships, so that the manifest's digest is of the installed sources
        _build_module().build_for_install(Path(self.build_lib) / "tf_autofuse",
                                          log=lambda line: print(line, flush=True))


class PlatformDistribution(Distribution):
    """The wheel holds libraries for one platform and Python: tag it so."""

    def has_ext_modules(self):
        return True


setup(
    name="tf_autofuse",
    version="0.1.0",
    description="Automatic fusion of memory-bound operator chains for TensorFlow",
    packages=find_packages(include=["tf_autofuse", "tf_autofuse.*"]),
    package_data={"tf_autofuse": ["cc/**/*.cc", "cc/**/*.h", "codegen/twin/*.h",
                                  "codegen/twin/*.cpp", "codegen/twin/acl/*.h",
                                  "codegen/host/*.h"]},
    python_requires=">=3.10",
    install_requires=["numpy", "protobuf"],
    extras_require={"test": ["pytest", "hypothesis", "mpmath"]},
    cmdclass={"build_py": BuildPyWithKernels},
    distclass=PlatformDistribution,
)

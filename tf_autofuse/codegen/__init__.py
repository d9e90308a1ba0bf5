"""Ascend C code generation for fused programs (docs/ASCEND.md).

    ir.py       the program as the generator reads it (parsed by tf_autofuse.rewriter.program)
    opmap.py    IR op -> Ascend C API / composition, with the reason for every op it cannot do
    tiling.py   UB budget, the tiling-data struct and the host tiling function
    ascendc.py  generate(program, name) -> Kernel: device kernel, tiling header, host glue
    build.py    compile-and-cache
    twin.py     the CPU twin (twin/kernel_operator.h) and the stand-in ACL runtime (twin/acl_stub.cpp)
    cann.py     CANN detection, the toolchain build, and the NPU dispatch decision (the bridge's
                attach_npu_libraries stamps the library on fused nodes for cc/kernel.cc)
    host/       the launch ABI (autofuse_launch.h) and npu_dispatch.h, included by cc/kernel.cc
    dump.py     the debug dump (--codegen_compile_debug) and the offline CLI
"""

from .ascendc import Kernel, generate, kernel_name, precision_blacklist

__all__ = ["Kernel", "generate", "kernel_name", "precision_blacklist"]

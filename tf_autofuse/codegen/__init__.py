"""Ascend C code generation for fused programs (docs/ASCEND.md).

    ir.py       the program as the generator reads it (parsed by tf_autofuse.rewriter.program)
    opmap.py    IR op -> Ascend C lowering, the one Ascend table: every catalog op is lowered or
                refused with a reason (checked at import)
    kernel.py   the Kernel result and the dtype tables
    schedule.py choosing a schedule (flat, broadcast, broadcast3, reduce, column)
    compute.py  what one tile computes, for any schedule
    emit/       one emitter per schedule: device kernel, tiling header, host glue
    cube.py     a MatMul and its epilogue as one mix kernel (Matmul API on the AIC, the epilogue
                on each C block in UB): plan, tiling, refusals; emitted by emit/matmul.py
    matmul_groups.py  the MatMuls of a fused graph with their epilogue (for the dump)
    tiling.py   UB budget, the tiling-data struct and the host tiling function
    ascendc.py  generate(program, name) -> Kernel: schedule, compute plan, emitter
    build.py    compile-and-cache
    twin.py     the CPU twin (twin/kernel_operator.h) and the stand-in ACL runtime (twin/acl_stub.cpp)
    cann.py     CANN detection, the toolchain build, and the resolver each AutofuseKernel asks for
                the library of its own program when it is constructed (cc/kernel.cc)
    host/       the launch ABI (autofuse_launch.h) and npu_dispatch.h, included by cc/kernel.cc
    dump.py     the debug dump (--codegen_compile_debug) and the offline CLI
"""

from .ascendc import Kernel, generate, kernel_name, precision_blacklist

__all__ = ["Kernel", "generate", "kernel_name", "precision_blacklist"]

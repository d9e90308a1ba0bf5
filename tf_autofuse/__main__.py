"""`python -m tf_autofuse COMMAND ...`:

  fuse MODEL -o OUT [--report]   fuse a frozen GraphDef (.pb/.pbtxt) or a SavedModel offline
  inspect MODEL                  the fusion table of a fused model
  codegen GRAPH -o DIR           the Ascend C of a saved graph's fused kernels
  doctor                         versions, the kernel library in use, CPU, plugin slot, CANN
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tf_autofuse",
        description="tf_autofuse offline tools. Fused models need `import tf_autofuse` (the "
                    "AutofuseKernel op) in the process that loads them.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    fuse = commands.add_parser(
        "fuse", help="fuse a model offline and write the fused model",
        description="Fuse MODEL and write OUT, of the same kind: a frozen GraphDef (.pb binary, "
                    ".pbtxt text) or a SavedModel directory (its signature's variables are frozen "
                    "into constants; OUT's signature of the same name runs the fused graph, with "
                    "the same input names and output keys). A record of the fusions is written "
                    "next to OUT for `inspect`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Fuser config keys for --config KEY=VALUE:\n" + _config_help())
    fuse.add_argument("model", metavar="MODEL", help="a .pb, a .pbtxt or a SavedModel directory")
    fuse.add_argument("-o", "--output", required=True, metavar="OUT",
                      help="where to write the fused model (the same kind as MODEL)")
    fuse.add_argument("--report", action="store_true", help="print the fusion report")
    fuse.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                      help="a Fuser config value, e.g. passes=pointwise,reduce or "
                           "enable_cost_model=true (repeatable)")
    fuse.add_argument("--outputs", default=None, metavar="NAMES",
                      help="GraphDefs only: comma-separated output tensors or nodes to keep "
                           "(default: every node nothing reads)")
    fuse.add_argument("--signature", default="serving_default",
                      help="SavedModels only: the signature to fuse (default serving_default)")

    inspect = commands.add_parser(
        "inspect", help="print the fusion table of a fused model",
        description="Print the fused kernels of a model written by `fuse` (or any graph holding "
                    "AutofuseKernel nodes): name, kind, operators, the nodes each replaced.")
    inspect.add_argument("model", metavar="MODEL", help="a .pb, a .pbtxt or a SavedModel directory")

    commands.add_parser(
        "doctor", help="say what this installation runs with, and why nothing would fuse",
        description="Print the TensorFlow and Keras in use, the kernel library loaded (built at "
                    "install or at import, for which instruction sets) or why none loaded, the "
                    "CPU's features, who holds TensorFlow's CPU plugin slot, the flags, and "
                    "whether a CANN toolkit was found. Exit status 1 when nothing can be fused.")
    commands.add_parser(
        "codegen", add_help=False, help="generate the Ascend C of a saved graph's fused kernels "
                                        "(`codegen --help` for its options)")
    return parser


def _config_help() -> str:
    from .fuser import FuserConfig

    return FuserConfig.describe()


def _fuser_from(items):
    from .fuser import ConfigError, Fuser

    fuser = Fuser()
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--config {item!r} is not KEY=VALUE")
        setattr(fuser.config, key.strip(), value.strip())
    return fuser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "codegen":  # its own parser and help
        from .codegen.dump import main as codegen_main

        return codegen_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "doctor":
        from .doctor import main as doctor_main

        return doctor_main()

    import tf_autofuse  # noqa: F401 - the AutofuseKernel op, to import and save fused graphs

    from . import offline
    from .fuser import ConfigError

    try:
        if args.command == "fuse":
            note = offline.environ_note()
            if note:
                print(note, file=sys.stderr)
            fuser = _fuser_from(args.config)
            outputs = [o.strip() for o in args.outputs.split(",") if o.strip()] \
                if args.outputs else None
            fused = offline.fuse_model(args.model, args.output, fuser, outputs, args.signature)
            print(f"{args.output}: {fused.get_fusion_count()} fused kernel(s), "
                  f"{fused.get_kernel_count(True)} -> {fused.get_kernel_count()} kernels")
            if args.report:
                print(fused.report())
            return 0
        print(offline.inspect_model(args.model))
        return 0
    except (offline.ModelError, ConfigError) as err:
        print(f"python -m tf_autofuse {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""`python -m tf_autofuse codegen GRAPH.pbtxt -o DIR`: the Ascend C of a saved graph's fused kernels."""

import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("codegen",):
        print("usage: python -m tf_autofuse codegen GRAPH.pbtxt -o DIR [--no-verify]", file=sys.stderr)
        return 2
    from .codegen.dump import main as codegen_main

    return codegen_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())

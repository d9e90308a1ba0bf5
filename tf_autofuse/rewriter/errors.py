"""What the rewriter does with an exception it did not expect (a bug in tf_autofuse).

Two levels, so that one bug costs as little fusion as possible and never reaches the user as a
bare TypeError:

- inside the lowering of one group (`lower.build` / `lower.check`), it becomes that group's
  refusal, with the exception as its reason (`internal_refusal`): the other groups still fuse;
- anywhere else in `rewrite()`, it becomes one `AutofuseError` that names the phase and the
  graph node being processed, says it is a bug to report, and chains the original exception.

The node being processed is kept in a `Progress` that the phases update as they go (`at`).
"""

from __future__ import annotations

import contextlib
import contextvars
import traceback
from typing import Iterator, Optional

# Every reason made from an unexpected exception starts with this (partition refusals quote
# the reason of the trial merge they refused, so it may also stand after a prefix).
INTERNAL_ERROR = "internal error"
REPORT = "this is a bug in tf_autofuse: please report it with the graph"


class AutofuseError(RuntimeError):
    """An internal error of the fusion pass: a bug in tf_autofuse, not in the user's graph.

    str(err) names the phase and the node being processed; err.__cause__ is the original
    exception, with its traceback.
    """


def describe(err: BaseException) -> str:
    """`TypeError: message (at file.py:line)`: the exception and the line that raised it."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {err}{where}"


def internal_refusal(err: BaseException) -> str:
    """The refusal reason of a group whose lowering raised `err`."""
    return f"{INTERNAL_ERROR}: {describe(err)}; {REPORT}"


def is_internal(reason: str) -> bool:
    return INTERNAL_ERROR + ": " in reason


class Progress:
    """The phase of `rewrite()` under way and the node it is processing."""

    __slots__ = ("phase", "node")

    def __init__(self) -> None:
        self.phase = "start"
        self.node: Optional[str] = None

    def error(self, err: BaseException) -> AutofuseError:
        node = f" at node {self.node!r}" if self.node is not None else ""
        return AutofuseError(f"{INTERNAL_ERROR} in the fusion pass ({self.phase}{node}): "
                             f"{describe(err)}; {REPORT}")


_current: contextvars.ContextVar[Optional[Progress]] = contextvars.ContextVar(
    "tf_autofuse_rewrite_progress", default=None)


@contextlib.contextmanager
def tracking(progress: Progress) -> Iterator[Progress]:
    """Make `progress` the one `phase` and `at` update, for the calls inside."""
    token = _current.set(progress)
    try:
        yield progress
    finally:
        _current.reset(token)


def phase(name: str) -> None:
    """A new phase begins: its name, and no node yet."""
    progress = _current.get()
    if progress is not None:
        progress.phase, progress.node = name, None


def at(node: str) -> None:
    """The phase under way now processes `node`."""
    progress = _current.get()
    if progress is not None:
        progress.node = node

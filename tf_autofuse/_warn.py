"""The one warning channel of tf_autofuse: each distinct message is said once per process."""

from __future__ import annotations

import threading
import warnings


class AutofuseWarning(UserWarning):
    """Something kept fusion from happening; the graph runs unfused and the program goes on."""


_lock = threading.Lock()
_said: set[str] = set()


def warn_once(message: str) -> bool:
    """Emit `message` as an AutofuseWarning unless it was said before. True if emitted."""
    with _lock:
        if message in _said:
            return False
        _said.add(message)
    warnings.warn(f"tf_autofuse: {message}", AutofuseWarning, stacklevel=2)
    return True


def said() -> list[str]:
    """The messages emitted so far in this process."""
    with _lock:
        return sorted(_said)


def reset() -> None:
    """Forget what was said (tests)."""
    with _lock:
        _said.clear()

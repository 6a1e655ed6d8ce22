"""convd.Error: every failure of the package, with the CONVD_E* name and the library's or the
daemon's sentence."""

from __future__ import annotations

from convd._lib import STATUS, STATUS_NAME


class Code(str):
    """The name of a status code, "CONVD_EBADSHAPE". It also compares equal to the name without
    its prefix ("EBADSHAPE") and to the number (-5), so that either spelling can be tested."""

    __slots__ = ()

    @property
    def value(self) -> int:
        return STATUS.get(self[6:], -27)

    @property
    def short(self) -> str:
        return self[6:]

    def __eq__(self, other):
        if isinstance(other, int) and not isinstance(other, bool):
            return self.value == other
        if isinstance(other, str):
            return str.__eq__(self, other) or str.__eq__(self[6:], other)
        return NotImplemented

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    __hash__ = str.__hash__


class PerformanceWarning(UserWarning):
    """convd works, but slower than it could: the sentence says why and what to change."""


def code_of(status: int | str) -> Code:
    if isinstance(status, str):
        name = status[6:] if status.startswith("CONVD_") else status
        if name not in STATUS:
            raise ValueError(f"unknown convd status name {status!r}")
        return Code("CONVD_" + name)
    return Code("CONVD_" + STATUS_NAME.get(int(status), "EINTERNAL"))


class Error(RuntimeError):
    """A convd call failed.

    ``code``: the status name, "CONVD_EBADSHAPE" (compares equal to "EBADSHAPE" and -5 too);
    ``status``: the number; ``message``: the sentence from the library or the daemon saying what
    was wrong. ``str(error)`` is "CONVD_EBADSHAPE: <sentence>".
    """

    def __init__(self, code: int | str, message: str = ""):
        self.code = code_of(code)
        self.status = self.code.value
        self.message = message or self.code.short
        super().__init__(f"{self.code}: {self.message}")

    def __reduce__(self):
        return (Error, (str(self.code), self.message))


def invalid(message: str) -> Error:
    return Error("EINVAL", message)

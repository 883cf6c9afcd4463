"""What every shard writer shares: closing on ``with`` (aborting on an exception), and
the frame compressor that ``compress=`` names."""

from __future__ import annotations

import abc
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from ..errors import WriterError
from ..source.codecs import CODECS, frame_compressor

__all__ = ["ClosingWriter", "compressor_for"]

_Writer = TypeVar("_Writer", bound="ClosingWriter")


def compressor_for(compress: str | None) -> Callable[[bytes], bytes] | None:
    """The frame compressor of ``compress`` (``None``: write plain tar)."""
    if compress is None:
        return None
    if compress not in CODECS:
        raise WriterError(
            f"compress must be one of {', '.join(map(repr, CODECS))} or None, got {compress!r}"
        )
    return frame_compressor(compress)


class ClosingWriter(abc.ABC):
    """A writer used as a context manager: ``with`` closes it, or aborts it on an exception.

    So an exception inside ``with`` never leaves a half-written shard under its final
    name.
    """

    @abc.abstractmethod
    def close(self) -> object:
        """Finish writing; calling it again does nothing."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Abandon what is being written."""

    def __enter__(self: _Writer) -> _Writer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

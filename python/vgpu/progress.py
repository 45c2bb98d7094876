"""Progress of long work on a terminal: one line on stderr, redrawn in
place ("vgpu.torch: weights of GPT  [#######.............]  37%  96.0 MiB
of 256.0 MiB") and cleared when the work ends.

It draws only where the stream is a terminal (its isatty()), unless told
otherwise: a log or a pipe never holds the redraws. The stream is a
parameter, so that a test can hand it a terminal or not.
"""

from __future__ import annotations

import sys
from typing import Optional, TextIO

_CELLS = 20


def format_size(n: int) -> str:
    """n bytes in binary units, as vgpuctl writes them: 96.0 MiB."""
    if n < 1024:
        return f"{n} B"
    v, units = n / 1024, "KMGTPE"
    i = 0
    while v >= 1023.95 and i < len(units) - 1:
        v /= 1024
        i += 1
    return f"{v:.1f} {units[i]}iB"


class Progress:
    """A progress line for total bytes of work, about `what`.

    enabled: True draws, False does not, None (the default) draws when the
    stream (default sys.stderr) is a terminal. Use it as a context manager,
    or call close(): the line is cleared either way.
    """

    def __init__(self, what: str, total: int, stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None, width: int = 80) -> None:
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.what, self.total, self.width = what, max(total, 1), width
        self._drawn = False

    def update(self, done: int) -> None:
        """Draws done of total bytes."""
        if not self.enabled:
            return
        done = min(max(done, 0), self.total)
        full = done * _CELLS // self.total
        text = (f"{self.what}  [{'#' * full}{'.' * (_CELLS - full)}] {done * 100 // self.total:3d}%  "
                f"{format_size(done)} of {format_size(self.total)}")
        if len(text) > self.width - 1:
            text = text[:self.width - 2] + "…"
        self.stream.write("\r" + text + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

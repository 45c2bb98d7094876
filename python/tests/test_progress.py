"""The progress line: drawn in place on a terminal, silent elsewhere."""

from __future__ import annotations

import io

from vgpu.progress import Progress, format_size


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_drawn_on_a_terminal() -> None:
    out = Terminal()
    with Progress("vgpu.torch: weights", 256 << 20, stream=out) as p:
        p.update(96 << 20)
        p.update(256 << 20)
    assert out.getvalue() == (
        "\rvgpu.torch: weights  [#######.............]  37%  96.0 MiB of 256.0 MiB\x1b[K"
        "\rvgpu.torch: weights  [####################] 100%  256.0 MiB of 256.0 MiB\x1b[K"
        "\r\x1b[K")
    assert "\n" not in out.getvalue()


def test_quiet_off_a_terminal_or_when_told() -> None:
    for out, enabled in ((io.StringIO(), None), (Terminal(), False)):
        with Progress("x", 10, stream=out, enabled=enabled) as p:
            p.update(5)
        assert out.getvalue() == ""
    forced = io.StringIO()
    with Progress("x", 10, stream=forced, enabled=True) as p:
        p.update(5)
    assert "50%" in forced.getvalue()


def test_fits_the_width() -> None:
    out = Terminal()
    Progress("a long description " * 5, 1 << 30, stream=out, width=40).update(1)
    line = out.getvalue().removeprefix("\r").removesuffix("\x1b[K")
    assert len(line) == 39 and line.endswith("…")


def test_format_size() -> None:
    assert [format_size(n) for n in (0, 1023, 1024, 96 << 20, (1 << 30) - 1, 3 << 40)] == \
        ["0 B", "1023 B", "1.0 KiB", "96.0 MiB", "1.0 GiB", "3.0 TiB"]

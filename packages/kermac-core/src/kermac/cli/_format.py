"""Plain-text helpers of the CLI: byte sizes and aligned tables."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_bytes", "render_table"]


def format_bytes(n: int) -> str:
    """`1536` → `'1.5 KiB'` (binary units, one decimal from KiB up)."""
    if n < 1024:
        return f"{n} B"
    units = ("KiB", "MiB", "GiB", "TiB")
    value, i = n / 1024, 0
    while value >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    return f"{value:.1f} {units[i]}"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> str:
    """Columns padded to their widest cell; the first `left` columns left-aligned, others right."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])

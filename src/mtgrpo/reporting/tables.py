"""Terminal tables that fit the width they are printed at.

rich shrinks a table wider than the terminal by narrowing its columns, down to nothing: at 80
columns a 14-column comparison shows empty columns, and a task name cut to ``countd…`` makes
``countdown:2x20`` and ``countdown:3x9`` look the same. A :class:`FittedTable` is built when it
is printed, for the width at hand: names (``whole`` columns) are never cut or wrapped, other
cells and headers wrap, and while the table still cannot fit, columns are left out in the
stated ``drop_order`` (a note names them and the file that keeps every column). A table whose
columns are names (the per-task table of a comparison) can instead be turned on its side.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["FittedTable"]


class FittedTable:
    """A rich renderable: ``headers`` and ``rows`` of text laid out for the console's width.

    ``whole``: column indices kept on one line at full width (names); ``drop_order``: headers
    of the columns to leave out first when the table does not fit; ``kept_in``: the file that
    keeps every column, for the note; ``transpose``: turn the table on its side (rows become
    columns) when it does not fit, before leaving anything out, with the first column of the
    turned table whole.
    """

    def __init__(self, headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str,
                 whole: Sequence[int] = (0,), drop_order: Sequence[str] = (),
                 kept_in: str = "the markdown file", transpose: bool = False) -> None:
        self.headers, self.rows, self.title = list(headers), [list(r) for r in rows], title
        self.whole, self.drop_order, self.kept_in = set(whole), list(drop_order), kept_in
        self.transpose = transpose

    def fit(self, console: Any, width: int) -> tuple[Any, list[str]]:
        """The table for ``width`` columns and the headers left out to fit it."""
        del console  # the width is all that matters; kept for rich's calling convention
        headers, rows, whole = self.headers, self.rows, self.whole
        if _min_width(headers, rows, whole) <= width or not (self.transpose or self.drop_order):
            return self._table(headers, rows, whole), []
        if self.transpose:
            # zip(*table) transposes: each header with its column becomes a row
            turned = [list(column) for column in zip(headers, *rows, strict=True)]
            return self._table(turned[0], turned[1:], {0}), []
        shown = list(range(len(headers)))
        dropped: list[str] = []
        for header in self.drop_order:
            if header not in headers:
                continue
            shown.remove(headers.index(header))
            dropped.append(header)
            if _min_width([headers[i] for i in shown], [[row[i] for i in shown] for row in rows],
                          {shown.index(i) for i in whole if i in shown}) <= width:
                break
        return self._table([headers[i] for i in shown], [[row[i] for i in shown] for row in rows],
                           {shown.index(i) for i in whole if i in shown}), dropped

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.text import Text

        table, dropped = self.fit(console, options.max_width)
        yield table
        if dropped:
            yield Text(f"• left out at {options.max_width} columns: {', '.join(dropped)} "
                       f"({self.kept_in} keeps every column; a wider terminal shows them)",
                       style="dim")

    def _table(self, headers: Sequence[str], rows: Sequence[Sequence[str]],
               whole: set[int]) -> Any:
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=self.title, title_justify="left")
        for i, header in enumerate(headers):
            names = i in whole
            numbers = all(_is_number(row[i]) for row in rows)
            table.add_column(escape(header), justify="left" if names and not numbers else "right",
                             style="bold" if i == 0 else None, no_wrap=names,
                             min_width=_column_width(header, [row[i] for row in rows], names),
                             overflow="fold")  # rich's default, ellipsis, cuts names
        for row in rows:
            # "[min–max]" is text, not markup; on its own line a spread cell stays narrow
            table.add_row(*(escape(cell.replace(" [", "\n[")) for cell in row))
        return table


def _column_width(header: str, cells: Sequence[str], whole: bool) -> int:
    """The narrowest a column may be: its longest text when it holds names, else its longest
    word (a number is never split across lines)."""
    texts = [header, *(line for cell in cells for line in cell.replace(" [", "\n[").splitlines())]
    if whole:
        return max(len(text) for text in texts)
    return max(len(word) for text in texts for word in text.split() or [""])


def _min_width(headers: Sequence[str], rows: Sequence[Sequence[str]], whole: set[int]) -> int:
    """The narrowest the table can be drawn: its columns at :func:`_column_width`, each with a
    space either side and a rule, plus the closing rule (rich's default box and padding)."""
    return 1 + sum(_column_width(h, [row[i] for row in rows], i in whole) + 3
                   for i, h in enumerate(headers))


def _is_number(text: str) -> bool:
    """``18.8``, ``+3.1``, ``—`` (no value) and ``never`` read as numbers: right-aligned."""
    try:
        float(text.rstrip("%"))
    except ValueError:
        return text in ("—", "-", "never")
    return True

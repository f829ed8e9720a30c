"""Result tables: markdown for files (pandas `DataFrame.to_markdown`) and rich tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence

from fides_rag.extras import require


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A pipe table of already formatted cells (written as given, never re-parsed), the first column left-aligned."""
    pd = require("pandas", "eval", purpose="markdown tables")
    require("tabulate", "eval", purpose="markdown tables")
    frame = pd.DataFrame([list(r) for r in rows], columns=list(header))
    align = ["left"] + ["right"] * (len(header) - 1)
    return frame.to_markdown(index=False, disable_numparse=True, colalign=align)


def terminal_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None, width: int = 120
) -> str:
    """A plain-text box table of already formatted cells (rich, no colour), numbers right-aligned."""
    table_mod = require("rich.table", "eval", purpose="terminal tables")
    console_mod = require("rich.console", "eval", purpose="terminal tables")
    table = table_mod.Table(box=require("rich.box", "eval").SIMPLE_HEAD)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console = console_mod.Console(width=width, color_system=None, force_terminal=False, record=True, file=_Null())
    console.print(table)
    text = "\n".join(line.rstrip() for line in console.export_text().splitlines()).strip("\n")
    return f"{title}\n{text}" if title else text  # the title on its own line: rich would wrap it to the table's width


class _Null:
    """A file that drops what is written (the console only records)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

"""What a benchmark returns: a JSON-able summary plus the tables a person reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass
class BenchResult:
    summary: dict[str, Any]
    tables: list[Table] = field(default_factory=list)

    def print_tables(self) -> None:
        console = Console()
        for table in self.tables:
            console.print(table)


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    """A rich table whose cells are formatted with `fmt`."""
    t = Table(title=title)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*(fmt(cell) for cell in row))
    return t


def fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e5:
            return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)

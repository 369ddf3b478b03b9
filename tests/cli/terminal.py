"""A tiny terminal emulator: what a person would see after a program's output, escape codes included.

Enough of a VT100/xterm for the live view and progress bars: printable characters with
auto-wrap at the right margin (the wrap happens when the next character arrives, as xterm does),
CR, LF (as a tty's ``onlcr`` turns it into CR LF), cursor movement (``A B C D E F G H``), erase in
line and in display (``K``, ``J``); colours and modes are ignored. Rows that scroll off the top
of a screen of ``height`` rows stay in the scrollback, where the cursor can no longer reach them,
as on a real terminal.
"""

from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[([?0-9;]*)([@-~])")
_OSC = re.compile(r"\x1b\].*?(?:\x07|\x1b\\)", re.DOTALL)


class Screen:
    """The rows written so far (scrollback first) on a terminal ``width`` columns wide."""

    def __init__(self, width: int, height: int = 10_000) -> None:
        self.width = width
        self.height = height
        self.rows: list[list[str]] = [[]]
        self.row = 0
        self.col = 0
        self.top = 0
        self._wrap_pending = False

    # -- reading

    def lines(self) -> list[str]:
        """Every row, scrollback included, without trailing blanks."""
        found = ["".join(row).rstrip() for row in self.rows]
        while found and not found[-1]:
            found.pop()
        return found

    def count(self, text: str) -> int:
        """Rows that contain ``text``."""
        return sum(text in line for line in self.lines())

    # -- writing

    def feed(self, data: str) -> None:
        index = 0
        while index < len(data):
            char = data[index]
            if char == "\x1b":
                osc = _OSC.match(data, index)
                if osc is not None:
                    index = osc.end()
                    continue
                csi = _CSI.match(data, index)
                if csi is not None:
                    self._control(csi.group(1), csi.group(2))
                    index = csi.end()
                    continue
                index += 2  # a two-character escape (ESC 7, ESC 8, ...): ignored
                continue
            if char == "\r":
                self.col, self._wrap_pending = 0, False
            elif char == "\n":
                self._down(1)
                self.col = 0
            elif char == "\b":
                self.col, self._wrap_pending = max(0, self.col - 1), False
            elif char >= " ":
                self._put(char)
            index += 1

    def _put(self, char: str) -> None:
        if self._wrap_pending:
            self._down(1)
            self.col, self._wrap_pending = 0, False
        row = self.rows[self.row]
        while len(row) <= self.col:
            row.append(" ")
        row[self.col] = char
        if self.col == self.width - 1:
            self._wrap_pending = True
        else:
            self.col += 1

    def _down(self, count: int) -> None:
        self._wrap_pending = False
        self.row += count
        while len(self.rows) <= self.row:
            self.rows.append([])
        if self.row >= self.top + self.height:
            self.top = self.row - self.height + 1

    def _up(self, count: int) -> None:
        self._wrap_pending = False
        self.row = max(self.top, self.row - count)

    def _control(self, params: str, command: str) -> None:
        if params.startswith("?"):
            return  # modes: cursor visibility and the like
        numbers = [int(part) if part else 0 for part in params.split(";")] if params else []
        first = numbers[0] if numbers else 0
        count = first or 1
        if command == "A":
            self._up(count)
        elif command == "B":
            self.row = min(self.top + self.height - 1, self.row + count)
            self._down(0)
        elif command == "C":
            self.col = min(self.width - 1, self.col + count)
        elif command == "D":
            self.col = max(0, self.col - count)
        elif command == "E":
            self._down(count)
            self.col = 0
        elif command == "F":
            self._up(count)
            self.col = 0
        elif command == "G":
            self.col = min(self.width - 1, count - 1)
        elif command == "H":
            row = (numbers[0] if numbers else 1) or 1
            col = (numbers[1] if len(numbers) > 1 else 1) or 1
            self.row = self.top + row - 1
            self._down(0)
            self.col = min(self.width - 1, col - 1)
        elif command == "K":
            self._erase_line(first)
        elif command == "J":
            self._erase_display(first)
        # m (colours) and anything else: no effect on the text

    def _erase_line(self, mode: int) -> None:
        row = self.rows[self.row]
        if mode == 0:
            del row[self.col :]
        elif mode == 1:
            for index in range(min(self.col + 1, len(row))):
                row[index] = " "
        else:
            row.clear()

    def _erase_display(self, mode: int) -> None:
        if mode == 0:
            self._erase_line(0)
            for index in range(self.row + 1, len(self.rows)):
                self.rows[index] = []
        elif mode == 1:
            for index in range(self.top, self.row):
                self.rows[index] = []
            self._erase_line(1)
        else:
            for index in range(self.top, len(self.rows)):
                self.rows[index] = []


__all__ = ["Screen"]

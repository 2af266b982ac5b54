"""One answer's text, split as it arrives into content and tool calls, so no call markup reaches the content.

Text that could still be the start of a marker is held back, and released once it cannot; from a marker
on, the text is the calls', never content. A call goes out once the format sees it whole (Hermes: at
its closing tag; the JSON formats: when the answer ends). If the answer ends and the text from the
marker on holds no call, it was plain text after all and goes out as content. A whole answer is read
by the same machine in one piece, so streamed and plain answers agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .calls import ToolCall
from .format import ToolCallFormat


def _held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could begin a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


@dataclass
class Delta:
    """What a piece of the answer adds: content text, and calls (new ones, in order)."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


class ToolCallStream:
    def __init__(self, format: ToolCallFormat):
        self.format = format
        self.pending = ""  # not yet released: could begin a marker
        self.call_text: str | None = None  # from the first marker on, once one was seen
        self.calls: list[ToolCall] = []  # sent so far
        self.started = False  # some non-blank text was seen (at_start_only formats look no further)

    def push(self, text: str) -> Delta:
        if self.call_text is not None:
            self.call_text += text
            return Delta(calls=self._new(self.format.complete_calls(self.call_text)))
        self.pending += text
        if self.format.at_start_only:
            return self._at_start()
        found = [(self.pending.find(m), m) for m in self.format.markers if m in self.pending]
        if found:
            at = min(found)[0]
            content, self.call_text, self.pending = self.pending[:at], self.pending[at:], ""
            return Delta(content, self._new(self.format.complete_calls(self.call_text)))
        keep = _held_back(self.pending, self.format.markers)
        content, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return Delta(content)

    def _at_start(self) -> Delta:
        stripped = self.pending.lstrip()
        if not stripped:
            return Delta()
        if any(stripped.startswith(m) for m in self.format.markers):
            self.call_text, self.pending = self.pending, ""  # leading blanks go with the calls: none is content
            return Delta()
        if any(m.startswith(stripped) for m in self.format.markers):
            return Delta()
        self.format = _PLAIN  # the answer is text: nothing more to look for
        content, self.pending = self.pending, ""
        return Delta(content)

    def finish(self) -> Delta:
        """The answer ended: the rest, content or calls."""
        content, self.pending = self.pending, ""
        if self.call_text is None:
            return Delta(content)
        calls = self.format.calls(self.call_text)
        if calls is None and not self.calls:
            content, self.call_text = self.call_text, None
            return Delta(content)
        return Delta(calls=self._new(calls or []))

    def _new(self, calls: list[ToolCall]) -> list[ToolCall]:
        new = calls[len(self.calls):]
        self.calls += new
        return new


class _PlainText(ToolCallFormat):
    name = "none"


_PLAIN = _PlainText()


def split_answer(format: ToolCallFormat, text: str) -> Delta:
    """A whole answer's content and calls."""
    stream = ToolCallStream(format)
    first, last = stream.push(text), stream.finish()
    return Delta(first.content + last.content, first.calls + last.calls)

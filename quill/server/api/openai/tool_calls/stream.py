"""One answer's text, split as it arrives into content and tool calls, so no call markup reaches the content.

Text that could still be the start of a marker is held back, and released once it cannot; from a marker
on, the text is the calls', never content. A call goes out as soon as its name is read, then its
arguments' text as it arrives. If the answer ends and the text from the marker on held no call, it was
plain text after all and goes out as content. A whole answer is read by the same machine in one piece,
so streamed and plain answers agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .calls import ToolCall, new_call_id
from .format import ToolCallFormat


@dataclass
class CallDelta:
    """A piece of call `index`: its id and name when it opens (arguments ""), else more of its arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


@dataclass
class Delta:
    """What a piece of the answer adds: content text, then pieces of calls."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __add__(self, other: "Delta") -> "Delta":
        return Delta(self.content + other.content, self.calls + other.calls)


def _held_back(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could begin a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


class ToolCallStream:
    def __init__(self, format: ToolCallFormat):
        self.format: ToolCallFormat | None = format  # None: the answer is plain text, nothing more to look for
        self.pending = ""  # not yet released: could begin a marker
        self.call_text: str | None = None  # from the first marker on, once one was seen
        self.calls: list[ToolCall] = []  # sent so far, each with the arguments sent so far

    def push(self, text: str) -> Delta:
        if self.format is None:
            return Delta(text)
        if self.call_text is not None:
            self.call_text += text
            return self._read_calls()
        self.pending += text
        return self._at_start() if self.format.at_start_only else self._anywhere()

    def finish(self) -> Delta:
        """The answer ended: the rest, as content or as calls."""
        content, self.pending = self.pending, ""
        if self.call_text is not None and not self.calls:  # no call in the text from the marker on
            content, self.call_text = self.call_text, None
        return Delta(content)

    def _anywhere(self) -> Delta:
        found = [self.pending.find(m) for m in self.format.markers if m in self.pending]
        if found:
            at = min(found)
            content, self.call_text, self.pending = self.pending[:at], self.pending[at:], ""
            return Delta(content) + self._read_calls()
        keep = _held_back(self.pending, self.format.markers)
        content, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return Delta(content)

    def _at_start(self) -> Delta:
        stripped = self.pending.lstrip()
        if not stripped:
            return Delta()
        if any(stripped.startswith(m) for m in self.format.markers):
            self.call_text, self.pending = self.pending, ""  # leading blanks go with the calls: none is content
            return self._read_calls()
        if any(m.startswith(stripped) for m in self.format.markers):
            return Delta()
        self.format = None
        content, self.pending = self.pending, ""
        return Delta(content)

    def _read_calls(self) -> Delta:
        delta = Delta()
        for index, call in enumerate(self.format.scan(self.call_text) or []):
            if index == len(self.calls):
                self.calls.append(ToolCall(call.name, "", new_call_id()))
                delta.calls.append(CallDelta(index, "", self.calls[index].id, call.name))
            sent = self.calls[index]
            if len(call.arguments) > len(sent.arguments) and call.arguments.startswith(sent.arguments):
                delta.calls.append(CallDelta(index, call.arguments[len(sent.arguments):]))
                sent.arguments = call.arguments
        return delta


def split_answer(format: ToolCallFormat, text: str) -> tuple[str, list[ToolCall]]:
    """A whole answer's content and calls."""
    stream = ToolCallStream(format)
    delta = stream.push(text) + stream.finish()
    return delta.content, stream.calls

"""Tool calls in a model's answer: one module per family's format, a registry of them, and the machine that
splits an answer, streamed or whole, into content and calls."""

from .calls import ToolCall
from .format import ToolCallFormat
from .registry import TOOL_CALL_FORMATS, detect_format, tool_call_format
from .stream import CallDelta, Delta, ToolCallStream, split_answer

__all__ = ["TOOL_CALL_FORMATS", "CallDelta", "Delta", "ToolCall", "ToolCallFormat", "ToolCallStream",
           "detect_format", "split_answer", "tool_call_format"]

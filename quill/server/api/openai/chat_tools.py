"""A chat request's tools and tool_choice, checked, and what they make of it: the tools the template shows
the model, and how its answer is read (a family's call format for "auto", a JSON schema the answer is held
to for "required" or a named function, plain text for "none").

Every problem is a 400 naming it, before anything is submitted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quill.server.hosting import HostedModel

from ..validation import invalid
from .chat_schemas import ChatCompletionRequest, Tool
from .tool_calls import ToolCallFormat, detect_format, tool_call_format
from .tool_calls.forced import NamedFormat, RequiredFormat, named_schema, required_schema
from .tool_calls.mistral import TOOL_CALLS

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
CHOICES = ("none", "auto", "required")


@dataclass
class ToolPlan:
    tools: list[dict] | None  # for the template, as transformers passes them: {"type": "function", "function": ...}
    format: ToolCallFormat | None  # how the answer is read; None: as plain text
    schema: dict | None = None  # the JSON schema the answer is held to ("required", a named function)


def checked_tools(given: list[Tool] | None) -> list[dict]:
    """The tools as the template reads them, or a 400 naming what is wrong with one."""
    tools, names = [], set()
    for i, tool in enumerate(given or []):
        if tool.type != "function":
            raise invalid(f"tools[{i}].type must be \"function\", got {tool.type!r}", f"tools.{i}.type")
        function = tool.function
        if not FUNCTION_NAME.fullmatch(function.name):
            raise invalid(f"tools[{i}].function.name must be 1 to 64 letters, digits, underscores or dashes, got "
                          f"{function.name!r}", f"tools.{i}.function.name")
        if function.name in names:
            raise invalid(f"tools[{i}].function.name {function.name!r} is given twice", f"tools.{i}.function.name")
        names.add(function.name)
        parameters = function.parameters
        if parameters is not None and parameters.get("type", "object") != "object":
            raise invalid(f"tools[{i}].function.parameters must be the JSON schema of an object (\"type\": "
                          f"\"object\"), got type {parameters.get('type')!r}", f"tools.{i}.function.parameters")
        tools.append(tool.model_dump(exclude_none=True))
    return tools


def _choice(request: ChatCompletionRequest, names: list[str]) -> tuple[str, str | None]:
    """("none" | "auto" | "required" | "named", the function's name when named)."""
    choice = request.tool_choice
    if choice is None:
        return ("auto" if names else "none"), None
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise invalid(f"tool_choice must be one of {', '.join(CHOICES)} or {{\"type\": \"function\", "
                          f"\"function\": {{\"name\": ...}}}}, got {choice!r}", "tool_choice")
        if choice == "required" and not names:
            raise invalid("tool_choice \"required\" needs tools", "tool_choice")
        return ("none" if choice == "auto" and not names else choice), None
    if choice.type != "function":
        raise invalid(f"tool_choice.type must be \"function\", got {choice.type!r}", "tool_choice.type")
    if choice.function.name not in names:
        listed = ", ".join(names) if names else "none are given"
        raise invalid(f"tool_choice names the function {choice.function.name!r}, which is not among the tools "
                      f"({listed})", "tool_choice.function.name")
    return "named", choice.function.name


def answer_format(hosted: HostedModel, parser: str | None) -> ToolCallFormat | None:
    """How `hosted`'s model writes calls: --tool-call-parser's format, else the one its template teaches."""
    if parser is not None:
        return tool_call_format(parser)
    template = hosted.template_for(tools=True)
    source = template.source if template is not None else None
    vocabulary = {TOOL_CALLS} if hosted.tokenizer.token_to_id(TOOL_CALLS) is not None else set()
    name = detect_format(source, vocabulary)
    return None if name is None else tool_call_format(name)


def plan_tools(request: ChatCompletionRequest, hosted: HostedModel, parser: str | None) -> ToolPlan:
    """The request's tools checked against `hosted`'s template; `parser`: --tool-call-parser, if given."""
    tools = checked_tools(request.tools)
    names = [t["function"]["name"] for t in tools]
    choice, named = _choice(request, names)
    template = hosted.template_for(bool(tools))
    if tools and choice != "none" and template is not None and not template.reads_tools:
        raise invalid(f"the chat template of the model {hosted.name!r} does not support tools: it never shows "
                      "them to the model; leave tools out, or give a template that reads them with --chat-template",
                      "tools")
    shown = tools or None
    if choice == "none" or template is None:  # no template: rendering the prompt says so
        return ToolPlan(shown, None)
    if choice == "auto":
        format = answer_format(hosted, parser)
        if format is None:
            raise invalid(f"tool_choice \"auto\": Quill does not know the tool-call format of the model "
                          f"{hosted.name!r} from its chat template; start the server with --tool-call-parser "
                          "NAME, or use tool_choice \"required\" or a named function", "tool_choice")
        return ToolPlan(shown, format)
    functions = [t["function"] for t in tools]
    if choice == "required":
        return ToolPlan(shown, RequiredFormat(), required_schema(functions))
    function = next(f for f in functions if f["name"] == named)
    return ToolPlan(shown, NamedFormat(named), named_schema(function))

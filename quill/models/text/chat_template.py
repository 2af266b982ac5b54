"""Chat messages -> prompt text, by a checkpoint's Jinja chat template, rendered as transformers renders it.

The template runs in Jinja's immutable sandbox (templates from the hub are untrusted code) with
what transformers gives it: `trim_blocks` and `lstrip_blocks`, loop controls, the globals
`raise_exception` and `strftime_now`, a `tojson` filter that does not escape HTML, the
`{% generation %}` tag, the special tokens under their names (`bos_token`, ...), `messages`,
`add_generation_prompt`, `tools` and `documents`, and any extra keyword arguments. So the
text, tokenized without special tokens (the template writes BOS itself), gives the ids
`AutoTokenizer.apply_chat_template(..., tokenize=True)` gives.

Message content is text, as a string or as OpenAI's list of text parts. A template that loops
over a message's content (multimodal templates do) gets the parts; any other gets the parts'
texts joined by newlines (vLLM's rule).
"""

from __future__ import annotations

import copy
import json
from datetime import datetime

import jinja2
from jinja2 import meta, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# transformers' marker for continue_final_message: appended to the last message, found in the
# rendered text, cut there. Its trailing space tells whether the template trimmed the message.
CONTINUE_MARKER = "CONTINUE_FINAL_MESSAGE_TAG "
PART_SEPARATOR = "\n"  # between the text parts of one message, for templates that expect a string


class ChatTemplateError(ValueError):
    """The template does not compile, or refuses these messages (raise_exception, a failed filter, ...)."""


class _GenerationTag(Extension):
    """transformers' `{% generation %}...{% endgeneration %}` marks the assistant's text for training
    masks; rendering a prompt needs only its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


def _sandbox() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _loops_over_content(tree: nodes.Template) -> bool:
    """Whether some `for` loop iterates over a `.content` / `['content']` (possibly filtered)."""
    for loop in tree.find_all(nodes.For):
        target = loop.iter
        while isinstance(target, nodes.Filter):
            target = target.node
        if isinstance(target, nodes.Getattr) and target.attr == "content":
            return True
        if isinstance(target, nodes.Getitem) and isinstance(target.arg, nodes.Const) and target.arg.value == "content":
            return True
    return False


def _texts(content) -> list[str]:
    return [content] if isinstance(content, str) else [part["text"] for part in content]


class ChatTemplate:
    """One compiled template and the special tokens it sees."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None):
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        env = _sandbox()
        try:
            self._template = env.from_string(source)
            tree = env.parse(source)
            self.takes_content_parts = _loops_over_content(tree)
            # Whether the template shows the model the tools it is given (transformers passes them to any).
            self.reads_tools = "tools" in meta.find_undeclared_variables(tree)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"the chat template does not compile: {e.message} (line {e.lineno})") from None

    def _content(self, content):
        """A message's content in the form this template reads."""
        if self.takes_content_parts:
            return [{"type": "text", "text": t} for t in _texts(content)]
        return PART_SEPARATOR.join(_texts(content))

    def render(self, messages: list[dict], add_generation_prompt: bool = True, continue_final_message: bool = False,
               **kwargs) -> str:
        """The prompt for `messages` (dicts with "role" and "content", plus whatever else the template
        reads). `continue_final_message`: the text ends inside the last message, for the model to go on
        with it. Keyword arguments reach the template and override the special tokens of the same name."""
        if not messages:
            raise ChatTemplateError("there are no messages")
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError("add_generation_prompt and continue_final_message cannot both be true")
        # None-valued keys are dropped, as transformers does: templates test for missing keys, not nulls.
        chat = [{k: v for k, v in copy.deepcopy(m).items() if v is not None} for m in messages]
        for message in chat:
            if "content" in message:
                message["content"] = self._content(message["content"])
        if continue_final_message:
            last = self._mark_final(chat[-1])
        values = {**self.special_tokens, **kwargs}
        try:
            text = self._template.render(messages=chat, add_generation_prompt=add_generation_prompt,
                                         tools=values.pop("tools", None), documents=values.pop("documents", None),
                                         **values)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template refused these messages: {e}") from None
        except Exception as e:  # noqa: BLE001 - a template is code: any failure of it is the messages' problem
            raise ChatTemplateError(f"the chat template failed on these messages: {type(e).__name__}: {e}") from None
        return self._cut_at_marker(text, last) if continue_final_message else text

    @staticmethod
    def _mark_final(message: dict) -> str:
        """Append the marker to the last message's (last) text; return that text."""
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = content + CONTINUE_MARKER
            return content
        if content:
            content[-1]["text"] += CONTINUE_MARKER
            return content[-1]["text"].removesuffix(CONTINUE_MARKER)
        raise ChatTemplateError("continue_final_message needs a last message with text to continue")

    @staticmethod
    def _cut_at_marker(text: str, final: str) -> str:
        marker = CONTINUE_MARKER.strip()
        if marker not in text or final.strip() not in text:
            raise ChatTemplateError("continue_final_message: the chat template does not keep the last message's text")
        at = text.rindex(marker)
        # The marker's space gone means the template trimmed the message: trim what precedes it too.
        return text[:at] if text[at:].startswith(CONTINUE_MARKER) else text[:at].rstrip()

"""Chat templates render as transformers renders them: the same prompt ids as
`AutoTokenizer.apply_chat_template` for every tiny hub checkpoint and each of its named templates,
the same text for templates that lean on Jinja's whitespace rules and transformers' helpers, and
a sandbox that refuses to reach outside the template."""

from __future__ import annotations

from datetime import datetime

import pytest
import transformers

from quill.models.text.chat_template import ChatTemplate, ChatTemplateError
from quill.models.text.tokenizer import Tokenizer
from quill.models.text.tokenizer_config import read_tokenizer_config
from tests.hub_checkpoints import BUILDERS

CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "To be, or not to be"}],
    "with system": [
        {"role": "system", "content": "Answer in verse."},
        {"role": "user", "content": "Who is there?"},
        {"role": "assistant", "content": " Nay, answer me: stand, and unfold yourself. "},
        {"role": "user", "content": "héllo wörld 🎉\ntwo lines"},
    ],
    "special tokens in text": [{"role": "user", "content": "<|eot_id|>To be</s><s><|im_end|>"}],
}
CONTINUED = [{"role": "user", "content": "Who is there?"}, {"role": "assistant", "content": "Nay, answer me:"}]
# (checkpoint, template name, what that template reads beside the messages)
TEMPLATES = [(repo, "default", {}) for repo in BUILDERS if repo != "quill-test/tiny-mistral"] + [
    ("quill-test/tiny-phi3", "tool_use",
     {"tools": [{"type": "function", "function": {"name": "scan", "parameters": {"a": "<&>"}}}]}),
    ("quill-test/tiny-gemma", "rag", {"documents": [{"title": "T", "text": "Words, words, words."}]}),
]


@pytest.fixture(scope="module")
def checkpoints(hub_cache):
    """repo id -> (AutoTokenizer, Quill tokenizer, tokenizer config)."""
    out = {}
    for repo, checkpoint in hub_cache[1].items():
        auto = transformers.AutoTokenizer.from_pretrained(checkpoint.path)
        out[repo] = (auto, Tokenizer.from_file(checkpoint.path / "tokenizer.json", None),
                     read_tokenizer_config(checkpoint.path))
    return out


@pytest.mark.parametrize("repo,name,extra", TEMPLATES, ids=lambda v: v.split("/")[-1] if isinstance(v, str) else "")
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_prompt_ids_equal_apply_chat_template(checkpoints, repo, name, extra, conversation):
    auto, tokenizer, config = checkpoints[repo]
    template = ChatTemplate(config.chat_templates[name], config.special_tokens)
    messages = CONVERSATIONS[conversation]
    named = dict(chat_template=name) if isinstance(auto.chat_template, dict) else {}  # else the one template
    for add_generation_prompt in (True, False):
        expected = auto.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                            return_dict=False, **named, **extra)
        text = template.render(messages, add_generation_prompt=add_generation_prompt, **extra)
        assert tokenizer.encode(text, add_special_tokens=False) == list(expected)


@pytest.mark.parametrize("repo", [r for r in BUILDERS if r != "quill-test/tiny-mistral"])
def test_continue_final_message_equals_transformers(checkpoints, repo):
    auto, _, config = checkpoints[repo]
    template = ChatTemplate(config.chat_template, config.special_tokens)
    expected = auto.apply_chat_template(CONTINUED, continue_final_message=True, tokenize=False)
    text = template.render(CONTINUED, add_generation_prompt=False, continue_final_message=True)
    assert text == expected and text.endswith("Nay, answer me:")


# Templates that exercise Jinja's whitespace control and transformers' helpers and tags.
HELPERS = {
    "blocks on their own lines": (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n[U] {{ m.content }}\n    {% else %}\n"
        "[A] {{ m.content }}\n    {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}\n[A]{% endif %}"
    ),
    "tojson without HTML escapes": "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2, sort_keys=true) }}",
    "generation tag": "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}",
    "loop controls and namespace": (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}{{ ns.n }}:{{ m.content }};{% if ns.n == 2 %}{% break %}{% endif %}{% endfor %}"
    ),
    "content parts looped over": (
        "{% for m in messages %}{{ m.role }}:{% for part in m['content'] %}({{ part.type }}={{ part.text }})"
        "{% endfor %}\n{% endfor %}"
    ),
    "reads a keyword argument": "{{ greeting | default('hello') }} {{ bos_token }}{{ messages[-1].content }}",
}


@pytest.mark.parametrize("name", list(HELPERS))
def test_text_equals_transformers_for_templates_using_jinja_rules_and_helpers(checkpoints, name):
    auto, _, config = checkpoints["quill-test/tiny-llama-chat"]
    source = HELPERS[name]
    messages = CONVERSATIONS["with system"] + [{"role": "user", "content": "<b>tags & quotes 'x'</b>"}]
    kwargs = {"greeting": "hail"} if "keyword" in name else {}
    template = ChatTemplate(source, config.special_tokens)
    if template.takes_content_parts:  # transformers passes content as given: give it the parts
        messages = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    expected = auto.apply_chat_template(messages, chat_template=source, add_generation_prompt=True, tokenize=False,
                                        **kwargs)
    assert template.render(messages, **kwargs) == expected


def test_text_parts_joined_for_a_string_template_and_kept_for_a_parts_template():
    messages = [{"role": "user", "content": [{"type": "text", "text": "To be,"}, {"type": "text", "text": "or not"}]},
                {"role": "assistant", "content": "Ay."}]
    joined = ChatTemplate("{% for m in messages %}{{ m.content }}|{% endfor %}")
    assert not joined.takes_content_parts
    assert joined.render(messages) == "To be,\nor not|Ay.|"
    parts = ChatTemplate(HELPERS["content parts looped over"])
    assert parts.takes_content_parts
    assert parts.render(messages) == "user:(text=To be,)(text=or not)assistant:(text=Ay.)"


def test_raise_exception_and_failures_inside_the_template_become_chat_template_errors():
    strict = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('roles must start with user') }}"
                          "{% endif %}{{ messages[0].content }}")
    with pytest.raises(ChatTemplateError, match="roles must start with user"):
        strict.render([{"role": "assistant", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="failed"):
        ChatTemplate("{{ messages[0].content + 1 }}").render([{"role": "user", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="no messages"):
        strict.render([])
    with pytest.raises(ChatTemplateError, match="cannot both"):
        strict.render([{"role": "user", "content": "hi"}], add_generation_prompt=True, continue_final_message=True)


def test_sandbox_refuses_to_reach_python_internals_or_mutate():
    message = [{"role": "user", "content": "x"}]
    for source in ("{{ messages.__class__.__mro__ }}", "{{ ''.__class__.__subclasses__() }}",
                   "{% set l = [] %}{{ l.append(1) }}", "{{ messages[0].update({'role': 'system'}) }}"):
        with pytest.raises(ChatTemplateError, match="unsafe"):
            ChatTemplate(source).render(message)


def test_strftime_now_and_special_tokens_reach_the_template():
    template = ChatTemplate("{{ strftime_now('%Y') }} {{ bos_token }}{{ eos_token }}", {"bos_token": "<s>",
                                                                                        "eos_token": "</s>"})
    assert template.render([{"role": "user", "content": "x"}]) == f"{datetime.now():%Y} <s></s>"
    # Keyword arguments override special tokens of the same name, as in transformers.
    assert template.render([{"role": "user", "content": "x"}], bos_token="[B]").endswith("[B]</s>")


def test_continue_final_message_needs_the_template_to_keep_the_text():
    drops = ChatTemplate("{% for m in messages %}{{ m.role }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="does not keep"):
        drops.render(CONTINUED, add_generation_prompt=False, continue_final_message=True)


# A conversation with tools: calls given back with arguments as a dict and as a JSON string (transformers
# passes both to the template as they are), and the tools' results.
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
TOOL_CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and time in Elsinore?"},
    {"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Elsinore"}}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Cold, with a nipping air."},
    {"role": "tool", "tool_call_id": "call_2", "content": "Past midnight."},
    {"role": "assistant", "content": "Cold; past midnight."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize("repo", ["quill-test/tiny-qwen3", "quill-test/tiny-llama-chat"])
def test_tools_calls_and_results_render_as_transformers_renders_them(checkpoints, repo):
    auto, tokenizer, config = checkpoints[repo]
    template = ChatTemplate(config.chat_template, config.special_tokens)
    assert template.reads_tools
    for messages, tools in ((TOOL_CHAT, TOOLS), (TOOL_CHAT[:2], TOOLS), (TOOL_CHAT, None)):
        expected = auto.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        text = template.render(messages, tools=tools)
        assert tokenizer.encode(text, add_special_tokens=False) == list(expected)
        assert text == auto.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert '"arguments": {}' in template.render(TOOL_CHAT) or '"parameters": {}' in template.render(TOOL_CHAT)


def test_a_mistral_like_tools_template_renders_as_transformers_renders_it(checkpoints):
    from tests.hub_checkpoints import MISTRAL_TOOLS_TEMPLATE

    auto, _, config = checkpoints["quill-test/tiny-mistral"]
    template = ChatTemplate(MISTRAL_TOOLS_TEMPLATE, config.special_tokens)
    expected = auto.apply_chat_template(TOOL_CHAT, tools=TOOLS, chat_template=MISTRAL_TOOLS_TEMPLATE, tokenize=False)
    assert template.render(TOOL_CHAT, tools=TOOLS, add_generation_prompt=False) == expected
    assert "[TOOL_CALLS][" in expected and "[AVAILABLE_TOOLS]" in expected


def test_whether_a_template_reads_tools():
    assert not ChatTemplate("{{ messages[0].content }}").reads_tools
    assert ChatTemplate("{% if tools %}{{ tools | length }}{% endif %}").reads_tools

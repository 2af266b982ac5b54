"""Tiny random Hugging Face checkpoints, as the hub ships them, in a local HF cache layout.

Each checkpoint is written by transformers' own `save_pretrained` (model, tokenizer,
generation config) into `models--org--name/snapshots/<commit>/` with `refs/main`
pointing at it, so `huggingface_hub` finds it offline by hub id. Tokenizers are built
by the family's transformers tokenizer class and trained on a few lines, so their
tokenizer.json is what that class writes; chat templates sit where checkpoints keep
them (chat_template.jinja, additional_chat_templates/, a string or a list of named
templates in tokenizer_config.json).

`llama-chat` is the one to serve: sharded weights, a chat template, and a
generation_config.json whose EOS list is longer than config.json's, with an id that
greedy decoding of `CHAT_PROMPT` reaches after a few tokens. `reference_chat` is what
transformers makes of a chat on a checkpoint, for tests of the chat route.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tests.tiny_tokenizers import TEXT, build_hf_tokenizer

V = 300  # model vocabulary; every tokenizer here has at most this many tokens
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHAT_PROMPT = "To be, or not to be"
CHAT_MIN_TOKENS = 3  # greedy decoding of CHAT_PROMPT reaches a generation_config-only EOS id no sooner

# Templates that read `tools` are ours, written to behave as the families' own do: the tools shown to the model
# (Llama 3.1: in the first user turn, as JSON; Qwen: in the system turn between <tools> tags; Mistral: before the
# last user turn after [AVAILABLE_TOOLS]), an assistant's calls written back in the form the model answers in
# (arguments given as a JSON string kept as they are, a dict written with tojson), a tool's result in its
# family's turn (Llama: ipython; Qwen: <tool_response> in a user turn; Mistral: [TOOL_RESULTS]). Without tools
# they render as the plain templates did.
_CALL_FUNCTION = "{%- set fn = call.function if call.function is defined else call %}"
_ARGUMENTS = "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}"
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- set ns = namespace(first_user=true) %}{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' and message.tool_calls is defined %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- for call in message.tool_calls %}" + _CALL_FUNCTION +
    "{{- '{\"name\": \"' + fn.name + '\", \"parameters\": ' }}" + _ARGUMENTS +
    "{{- '}' }}{%- if not loop.last %}{{- '; ' }}{%- endif %}{%- endfor %}{{- '<|eot_id|>' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}"
    "{%- if message.content is mapping %}{{- message.content | tojson }}{%- else %}{{- message.content }}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if tools and message['role'] == 'user' and ns.first_user %}{%- set ns.first_user = false %}"
    "{{- 'When one of these functions helps, answer with nothing but its call as JSON, "
    "{\"name\": the function, \"parameters\": {each argument: its value}}.\\n\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson(indent=4) + '\\n\\n' }}{%- endfor %}{%- endif %}"
    "{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nThese functions can be called; their signatures, one per line:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nCall one by answering <tool_call>\\n{\"name\": the function, \"arguments\": an object}\\n"
    "</tool_call>, once per call.<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}"
    "{%- if message['role'] == 'system' and loop.first %}"
    "{%- elif message['role'] == 'assistant' and message.tool_calls is defined %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}" + _CALL_FUNCTION +
    "{{- '\\n<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}" + _ARGUMENTS +
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MISTRAL_TOOLS_TEMPLATE = (  # for a Mistral checkpoint whose tokenizer has the control tokens (given by --chat-template)
    "{{- bos_token }}{%- set ns = namespace(last_user=-1, system='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- elif message['role'] == 'system' %}{%- set ns.system = message['content'] %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- if loop.index0 == ns.last_user %}"
    "{%- if tools %}{{- '[AVAILABLE_TOOLS]' + tools | tojson + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{{- '[INST]' + (ns.system + '\\n\\n' if ns.system else '') + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST]' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message.tool_calls is defined %}{{- '[TOOL_CALLS][' }}"
    "{%- for call in message.tool_calls %}" + _CALL_FUNCTION +
    "{{- '{\"name\": \"' + fn.name + '\", \"arguments\": ' }}" + _ARGUMENTS +
    "{{- ', \"id\": \"' + call.id + '\"}' }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}"
    "{{- ']' + eos_token }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '[TOOL_RESULTS]{\"call_id\": \"' + message.tool_call_id + '\", \"content\": ' + message['content'] | tojson"
    " + '}[/TOOL_RESULTS]' }}{%- endif %}{%- endfor %}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
PHI3_TOOL_TEMPLATE = "{% for tool in tools %}{{ '<|tool|>' + tool | tojson + '<|/tool|>' }}{% endfor %}" + PHI3_TEMPLATE
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' "
    "else message['role']) + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
GEMMA_RAG_TEMPLATE = (
    "{{ bos_token }}{% for doc in documents %}{{ doc['text'] }}\\n{% endfor %}"
    + GEMMA_TEMPLATE.removeprefix("{{ bos_token }}")
)


@dataclass
class HubCheckpoint:
    repo_id: str
    path: Path  # the snapshot directory
    reference: torch.nn.Module  # the transformers model, in float32


def _shapes(**changes) -> dict:
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128,
                initializer_range=0.1)  # larger than the default, so greedy paths wander instead of repeating
    return {**base, **changes}


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Random init leaves norms at 1 (or 0) and biases at 0; perturb them so the tests see them."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _class_tokenizer(cls_name: str, specials: list[str], vocab_size: int = 200, **kwargs):
    """A tokenizer of transformers class `cls_name`, trained on a few lines with that class's own pipeline."""
    import transformers
    from tokenizers import pre_tokenizers, trainers

    tokenizer = getattr(transformers, cls_name)(**kwargs)
    # The class's special tokens keep the ids its pipeline gave them (Llama: <unk> 0, <s> 1, </s> 2).
    named = sorted({str(t) for t in tokenizer.all_special_tokens}, key=tokenizer.convert_tokens_to_ids)
    extra = dict(initial_alphabet=pre_tokenizers.ByteLevel.alphabet()) if cls_name == "Qwen2Tokenizer" else {}
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=named + specials, show_progress=False, **extra)
    tokenizer.backend_tokenizer.train_from_iterator(TEXT * 4, trainer)
    if specials:
        tokenizer.add_special_tokens({"extra_special_tokens": specials})
    tokenizer.update_post_processor()  # the trained backend still adds BOS as the class was told
    return tokenizer


def _llama3_tokenizer():
    """Byte-level BPE whose tokenizer.json post-processor adds <|begin_of_text|> (as Llama 3's does)."""
    import transformers
    from tokenizers import processors

    tok = build_hf_tokenizer(290)
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                            "<|eot_id|>"])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
    )
    tokenizer.chat_template = LLAMA3_TEMPLATE
    return tokenizer


def _greedy(model, ids: list[int], steps: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=steps, eos_token_id=None,
                         pad_token_id=0)
    return out[0, len(ids):].tolist()


def _llama_chat(directory: Path):
    import transformers

    tokenizer = _llama3_tokenizer()
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    config = transformers.LlamaConfig(**_shapes(), bos_token_id=tokenizer.bos_token_id, eos_token_id=eot,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = _perturbed(transformers.LlamaForCausalLM(config))
    # generation_config.json: config.json's EOS, <|end_of_text|>, and the first new token greedy decoding
    # of CHAT_PROMPT produces from its CHAT_MIN_TOKENS-th token on, so stopping on it is observable.
    ids = tokenizer(CHAT_PROMPT).input_ids
    greedy = _greedy(model, ids, 12)
    stop = next(t for i, t in enumerate(greedy) if i >= CHAT_MIN_TOKENS - 1 and t not in greedy[:i])
    end_of_text = tokenizer.convert_tokens_to_ids("<|end_of_text|>")
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=[eot, end_of_text, stop],
        do_sample=True, temperature=0.6, top_p=0.9, max_new_tokens=64,
    )
    model.save_pretrained(directory, max_shard_size="30KB")  # several shards; layer 1's gate and up in two of them
    tokenizer.save_pretrained(directory)
    return model


def _mistral(directory: Path):
    import transformers

    tokenizer = _class_tokenizer("LlamaTokenizer", [], add_bos_token=True)
    config = transformers.MistralConfig(**_shapes(), sliding_window=48, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = _perturbed(transformers.MistralForCausalLM(config))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)  # no chat template: a base model
    return model


def _qwen(model_type: str):
    def build(directory: Path):
        import transformers

        # Qwen's <tool_call> tags are added tokens, not special ones: answers keep them.
        tags = ["<tool_call>", "</tool_call>"] if model_type == "qwen3" else []
        tokenizer = _class_tokenizer("Qwen2Tokenizer", ["<|im_start|>", "<|im_end|>"], vocab_size=V - len(tags))
        tokenizer.add_tokens(tags)
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if model_type == "qwen2":
            config = transformers.Qwen2Config(**_shapes(), eos_token_id=eos)
            model_cls = transformers.Qwen2ForCausalLM
        else:  # explicit head_dim unlike hidden_size / heads, and bias on every attention projection
            config = transformers.Qwen3Config(**_shapes(head_dim=16), attention_bias=True, eos_token_id=eos)
            model_cls = transformers.Qwen3ForCausalLM
        torch.manual_seed(0)
        model = _perturbed(model_cls(config))
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        # The older layout: the template as a string inside tokenizer_config.json.
        _edit_json(directory / "tokenizer_config.json",
                   chat_template=QWEN_TOOLS_TEMPLATE if model_type == "qwen3" else CHATML_TEMPLATE)
        return model

    return build


def _phi3(directory: Path):
    import transformers

    tokenizer = _class_tokenizer("LlamaTokenizer", ["<|user|>", "<|assistant|>", "<|end|>"], add_bos_token=False)
    config = transformers.Phi3Config(**_shapes(), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = _perturbed(transformers.Phi3ForCausalLM(config))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    # Named templates as a list inside tokenizer_config.json.
    _edit_json(directory / "tokenizer_config.json", chat_template=[
        {"name": "default", "template": PHI3_TEMPLATE}, {"name": "tool_use", "template": PHI3_TOOL_TEMPLATE}])
    return model


def _gemma(directory: Path):
    import transformers

    tokenizer = _class_tokenizer("GemmaTokenizer", ["<start_of_turn>", "<end_of_turn>"], add_bos_token=True)
    tokenizer.chat_template = {"default": GEMMA_TEMPLATE, "rag": GEMMA_RAG_TEMPLATE}
    # Tied, sqrt(d_model)-scaled embeddings outweigh layers of the usual random init, and greedy decoding
    # repeats the last token forever: larger weights let the layers steer.
    config = transformers.GemmaConfig(**_shapes(head_dim=16, initializer_range=0.3), hidden_act="gelu_pytorch_tanh",
                                      bos_token_id=2, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = _perturbed(transformers.GemmaForCausalLM(config))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)  # chat_template.jinja + additional_chat_templates/rag.jinja
    return model


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}, indent=2))


BUILDERS = {
    "quill-test/tiny-llama-chat": _llama_chat,
    "quill-test/tiny-mistral": _mistral,
    "quill-test/tiny-qwen2": _qwen("qwen2"),
    "quill-test/tiny-qwen3": _qwen("qwen3"),
    "quill-test/tiny-phi3": _phi3,
    "quill-test/tiny-gemma": _gemma,
}


def snapshot_dir(cache: Path, repo_id: str, commit: str = COMMIT) -> Path:
    """Where huggingface_hub keeps `repo_id` at `commit` in the hub cache `cache`."""
    return cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit


def new_snapshot(cache: Path, repo_id: str) -> Path:
    """An empty snapshot directory of `repo_id` at COMMIT in the hub cache `cache`, its main branch pointing there."""
    snapshot = snapshot_dir(cache, repo_id)
    snapshot.mkdir(parents=True)
    refs = snapshot.parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text(COMMIT)
    return snapshot


def write_hub_cache(cache: Path) -> dict[str, HubCheckpoint]:
    """Every checkpoint of BUILDERS in the hub cache directory `cache` (what HF_HUB_CACHE names)."""
    out = {}
    for repo_id, build in BUILDERS.items():
        snapshot = new_snapshot(cache, repo_id)
        out[repo_id] = HubCheckpoint(repo_id, snapshot, build(snapshot))
    return out


def write_revisions(cache: Path, repo_id: str, source: Path, temperatures: dict[str, float],
                    refs: dict[str, str]) -> None:
    """`repo_id` in the hub cache `cache` with a snapshot per commit of `temperatures`, each the checkpoint
    `source` (its files linked, as the cache links blobs) with its own generation_config.json recommending
    that temperature, so a load shows which snapshot it read; `refs`: branch or tag -> commit."""
    repo_dir = snapshot_dir(cache, repo_id).parent.parent
    for commit, temperature in temperatures.items():
        snapshot = snapshot_dir(cache, repo_id, commit)
        snapshot.mkdir(parents=True)
        for file in source.iterdir():
            if file.name != "generation_config.json":
                (snapshot / file.name).symlink_to(file.resolve(), target_is_directory=file.is_dir())
        (snapshot / "generation_config.json").write_text(json.dumps({"temperature": temperature}))
    for ref, commit in refs.items():
        (repo_dir / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)


@dataclass
class ReferenceChat:
    prompt_ids: list[int]  # apply_chat_template(..., add_generation_prompt=True, tokenize=True)
    output_ids: list[int]  # greedy generate(), stopped by the checkpoint's EOS list (the EOS id included)
    logprobs: list[float]  # log p of each output token under the model's raw distribution
    text: str  # the reply: the output decoded without its EOS id and special tokens
    finish_reason: str  # "stop" (an EOS id) or "length"


def reference_chat(checkpoint: HubCheckpoint, messages: list[dict], max_new_tokens: int) -> ReferenceChat:
    """What transformers makes of a chat on `checkpoint`: its template's prompt ids, then greedy
    decoding with generation_config.json's EOS ids."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint.path)
    eos = transformers.GenerationConfig.from_pretrained(checkpoint.path).eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
    out = checkpoint.reference.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
                                        eos_token_id=eos, pad_token_id=0, output_logits=True,
                                        return_dict_in_generate=True)
    ids = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, ids)]
    stopped = bool(ids) and ids[-1] in eos
    text = tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=True)
    return ReferenceChat(prompt, ids, logprobs, text, "stop" if stopped else "length")

"""LibreTranslate's API over the hosted encoder-decoder models: POST /translate, GET /languages, POST /detect (not
offered: 501), GET /frontend/settings; so libretranslatepy and the apps that speak LibreTranslate work unchanged.

A translation is a request like /v1/completions' (generation.py: start, answer, trackers, the client going away),
its prompt the source ids and its first output tokens forced to the target language, decoded by beam search as
transformers' generate() decodes the checkpoint by default: its generation_config.json's beams (4 when it names
none), length penalty, early stopping and no-repeat n-gram size. `alternatives` are the beam search's next best.
Every text of a list is submitted at once, so continuous batching translates them together.

Errors are LibreTranslate's: {"error": message}, 400 for bad input, 404 when no hosted model translates.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from quill.models.text.seq2seq_tokenizer import LANGUAGE_STYLES
from quill.server.hosting import HostedModel

from ..errors import APIError, error_body
from ..generation import answer, loaded_host, resolve_model, start
from ..validation import build_params
from .schemas import (AUTO, DECLARED_CODE, GROUP_CODES, TranslateRequest, bad_request, language_name, match_code,
                      parse_translate, read_fields)

router = APIRouter(tags=["LibreTranslate"])

DEFAULT_BEAMS = 4  # transformers' translation pipelines and LibreTranslate's own engine search 4 beams by default


@dataclass(frozen=True)
class Translator:
    """What one hosted encoder-decoder model translates, and how its checkpoint decodes by default."""

    sources: tuple[str, ...] | None  # the source codes it takes; None: any (it does not mark the source)
    targets: tuple[str, ...] | None  # None: any (one fixed target it does not name)
    needs_source: bool  # the source language is part of its input (M2M100, NLLB, mBART): "auto" cannot be served
    source_tokens: bool  # the codes are its tokenizer's (passed on), not only declared by tokenizer_config.json
    target_tokens: bool
    picked: bool = True  # chosen for a request that names no model (BART, T5: only when named; they are not
    # translation families, and would otherwise accept every pair)
    decoding: dict = field(default_factory=dict)  # SamplingParams beam settings; beam_width always set
    max_new_tokens: int | None = None  # the checkpoint's own bound on a translation's length

    @property
    def lists_both(self) -> bool:
        return self.sources is not None and self.targets is not None


_translators: dict[int, tuple[object, Translator]] = {}  # id(LoadedModel) -> (it, kept so the id stays its own)


def translator(hosted: HostedModel) -> Translator:
    loaded = hosted.loaded
    entry = _translators.get(id(loaded))
    if entry is None or entry[0] is not loaded:
        entry = _translators[id(loaded)] = (loaded, _describe(loaded))
    return entry[1]


def _declared(value) -> str | None:
    """A language code a checkpoint declares for its one pair; group names ("ROMANCE", "mul") declare none."""
    ok = isinstance(value, str) and DECLARED_CODE.fullmatch(value) and value not in GROUP_CODES
    return value if ok else None


def _decoding(loaded) -> tuple[dict, int | None]:
    """The checkpoint's beam settings (its beams, or DEFAULT_BEAMS) and its bound on a translation's length."""
    max_new = loaded.generation_defaults.get("max_tokens")
    if max_new is None and loaded.max_length is not None and loaded.max_length > 1:
        max_new = loaded.max_length - 1  # an encoder-decoder's max_length counts the decoder's start token
    return {"beam_width": DEFAULT_BEAMS, **loaded.beam_defaults}, max_new


def _describe(loaded) -> Translator:
    """From what the loader read (generation_config.json's settings are empty with --generation-config none)."""
    seq2seq = loaded.seq2seq
    decoding, max_new = _decoding(loaded)
    codes = tuple(seq2seq.languages)
    if seq2seq.style in LANGUAGE_STYLES:
        return Translator(codes, codes, True, True, True, True, decoding, max_new)
    # Marian (its multilingual targets by token), BART, T5: the source is not marked; a pair may be declared
    pair = getattr(seq2seq, "pair", None)  # FSMT names its one pair in its tokenizer (`langs`)
    declared = pair or getattr(seq2seq, "declared_pair", (None, None))
    source, target = _declared(declared[0]), _declared(declared[1])
    targets = codes if codes else (target,) if target else None
    picked = seq2seq.style == "marian" or bool(source and target)  # a translation family, or one declaring its pair
    return Translator((source,) if source else None, targets, False, False, bool(codes), picked, decoding, max_new)


def _side(codes: tuple[str, ...] | None, code: str, tokens: bool, role: str, name: str) -> str | None:
    """The code to hand the tokenizer for one side (None: it takes none); 400 when the model lacks `code`."""
    if codes is None:
        return None
    found = match_code(code, list(codes))
    if found is None:
        raise bad_request(f"the model {name!r} does not translate {'from' if role == 'source' else 'into'} "
                          f"{code!r}; its {role} languages: {', '.join(codes)}")
    return found if tokens else None


def _languages(tr: Translator, request: TranslateRequest, name: str) -> tuple[str | None, str | None]:
    if request.source == AUTO:
        if tr.needs_source:
            raise bad_request(f"source 'auto' needs language detection, which this server does not offer: name the "
                              f"source language; the model {name!r} knows: {', '.join(tr.sources or ())}")
        source = None
    else:
        source = _side(tr.sources, request.source, tr.source_tokens, "source", name)
    return source, _side(tr.targets, request.target, tr.target_tokens, "target", name)


def _no_translator(request: TranslateRequest, translators: dict[str, Translator]) -> APIError:
    """Why no hosted model takes this pair, naming the languages there are."""
    def known(role: str) -> list[str]:
        return list(dict.fromkeys(c for tr in translators.values() for c in getattr(tr, role) or ()))

    def takes(role: str, code: str) -> bool:
        return any(getattr(tr, role) is None or match_code(code, list(getattr(tr, role)))
                   for tr in translators.values())

    sources, targets = known("sources"), known("targets")
    if request.source != AUTO and not takes("sources", request.source):
        return bad_request(f"source language {request.source!r} is not supported; known: {', '.join(sources)}")
    if not takes("targets", request.target):
        return bad_request(f"target language {request.target!r} is not supported; known: {', '.join(targets)}")
    if request.source == AUTO:  # only a model that needs no source language could have served it
        return bad_request(f"source 'auto' needs language detection, which this server does not offer for a "
                           f"translation into {request.target!r}: name the source language, one of: "
                           f"{', '.join(sources)}")
    return APIError(404, f"no hosted model translates from {request.source!r} into {request.target!r}",
                    reason="unknown_model")


def _choose(http: Request, request: TranslateRequest) -> tuple[HostedModel, Translator, str | None, str | None]:
    """The model named by `model`, else the first encoder-decoder one that takes both languages (one that names
    them before one that accepts any), with the codes its tokenizer is given."""
    if request.model is not None:
        hosted = resolve_model(http, request.model)
        if not hosted.loaded.is_encoder_decoder:
            raise bad_request(f"the model {hosted.name!r} is not a translation (encoder-decoder) model")
        tr = translator(hosted)
        return hosted, tr, *_languages(tr, request, hosted.name)
    host = loaded_host(http)
    translators = {name: tr for name, m in host.models.items() if m.loaded.is_encoder_decoder
                   for tr in [translator(m)] if tr.picked}
    if not translators:
        raise APIError(404, "no hosted model translates: this server hosts no translation (encoder-decoder) model "
                       "that takes language codes; name one with `model`", reason="unknown_model")
    for name in sorted(translators, key=lambda n: not translators[n].lists_both):  # stable: host order otherwise
        try:
            source, target = _languages(translators[name], request, name)
        except APIError:
            continue
        return resolve_model(http, name), translators[name], source, target
    raise _no_translator(request, translators)


def _error(e: APIError) -> JSONResponse:
    """LibreTranslate's {"error": message}, with the error_type Quill's other non-OpenAI answers carry."""
    return JSONResponse(error_body("/translate", e.status, e.message), status_code=e.status, headers=e.headers)


@router.post("/translate")
async def translate(http: Request):
    """LibreTranslate's translation: q (a text or a list), source (a code, or "auto" for a model that needs
    none), target, format (text), alternatives; api_key is checked by the server's key check (a bearer token);
    model (Quill's) picks the hosted model."""
    try:
        loaded_host(http)  # while loading: 503, whatever the request says
        request = parse_translate(await read_fields(http))
        hosted, tr, source, target = _choose(http, request)
        return await _translate(http, request, hosted, tr, source, target)
    except APIError as e:
        return _error(e)


async def _translate(http: Request, request: TranslateRequest, hosted: HostedModel, tr: Translator,
                     source: str | None, target: str | None) -> dict:
    config, seq2seq = http.app.state.config, hosted.loaded.seq2seq
    limit = hosted.loaded.model.config.max_source_len
    prompts, slots = [], []  # what is submitted, and the index in q of each
    for i, text in enumerate(request.texts):
        if not text.strip():
            continue  # nothing to translate: answered "" without the model
        where = f"q[{i}]" if request.is_list else "q"
        try:
            ids = seq2seq.source_ids(text, source, target)
        except ValueError as e:
            raise bad_request(f"{where}: {e}") from None
        if len(ids) > limit:
            raise bad_request(f"{where} is {len(ids)} tokens long, over the source limit of {limit} tokens of the "
                              f"model {hosted.name!r}; split the text")
        prompts.append((ids, text))
        slots.append(i)
    try:
        prefix = seq2seq.target_prefix(target)
    except ValueError as e:
        raise bad_request(str(e)) from None
    count = request.alternatives + 1
    if count > config.max_beam_width:
        raise bad_request(f"alternatives must be at most {config.max_beam_width - 1} (the server's largest beam "
                          f"width is {config.max_beam_width}), got {request.alternatives}")
    decoding = {**tr.decoding, "beam_width": max(min(tr.decoding["beam_width"], config.max_beam_width), count)}
    room = hosted.max_model_len - 1  # the decoder's sequence starts with its start token
    max_tokens = min(tr.max_new_tokens or room, room, config.max_tokens_limit)
    params = build_params(hosted, n=count, max_tokens=max_tokens, use_beam_search=True, forced_token_ids=prefix,
                          **decoding)
    base = f"translate-{uuid.uuid4().hex}"
    submitted = start(http, hosted, prompts, params, [f"{base}-{i}" for i in slots]) if prompts else []

    def build(outputs: list) -> dict:
        found: list[list[str]] = [[""] if not text.strip() else [] for text in request.texts]
        for i, out in zip(slots, outputs):
            ranked = sorted(out.outputs, key=lambda c: (-(c.score if c.score is not None else c.cumulative_logprob),
                                                        c.index))
            found[i] = [c.text for c in ranked[:count]]
        texts = [hyps[0] for hyps in found]
        alternatives = [hyps[1:] for hyps in found]
        body: dict = {"translatedText": texts if request.is_list else texts[0]}
        if request.alternatives:
            body["alternatives"] = alternatives if request.is_list else alternatives[0]
        return body

    return await answer(http, submitted, build) if submitted else build([])


@router.api_route("/languages", methods=["GET", "POST"])
async def languages(http: Request):
    """[{"code", "name", "targets"}] over the hosted encoder-decoder models, in the order they are hosted. A model
    that names neither side (BART, T5, a Marian pair it does not declare) adds nothing."""
    try:
        host = loaded_host(http)
    except APIError as e:
        return _error(e)
    targets: dict[str, list[str]] = {}
    for m in host.models.values():
        if not m.loaded.is_encoder_decoder:
            continue
        tr = translator(m)
        for code in tr.sources or ():
            listed = targets.setdefault(code, [])
            listed += [t for t in tr.targets or () if t != code and t not in listed]
        for code in tr.targets or ():
            targets.setdefault(code, [])
    return [{"code": code, "name": language_name(code), "targets": listed} for code, listed in targets.items()]


@router.post("/detect")
async def detect(http: Request):
    try:
        loaded_host(http)
    except APIError as e:
        return _error(e)
    return _error(APIError(501, "language detection is not offered by this server: name the source language "
                                "in /translate (GET /languages lists them)", reason="not_implemented"))


@router.get("/frontend/settings")
async def frontend_settings(http: Request):
    """What LibreTranslate's own page and some apps read before translating: no character limit, no files,
    whether a key is required, and a first pair to preselect."""
    config = http.app.state.config
    listed = await languages(http)
    if isinstance(listed, JSONResponse):
        return listed
    first = next((entry for entry in listed if entry["targets"]), None)
    pair = {} if first is None else {
        "source": {"code": first["code"], "name": first["name"]},
        "target": {"code": first["targets"][0], "name": language_name(first["targets"][0])}}
    return {"charLimit": -1, "frontendTimeout": 500, "apiKeys": bool(config.api_keys),
            "keyRequired": bool(config.api_keys), "suggestions": False, "filesTranslation": False,
            "supportedFilesFormat": [], "language": pair}

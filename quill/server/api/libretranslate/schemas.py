"""LibreTranslate's request fields, read as LibreTranslate reads them, and its language codes and names.

LibreTranslate takes its fields from a JSON body or a form (libretranslatepy and curl send form-urlencoded, its
web page sends JSON), and from the query string, so every shape is read here by hand rather than by a pydantic
body: a form's fields are strings ("alternatives=2"), and unknown fields are ignored as LibreTranslate ignores
them. Errors are APIError(400); the routes answer them as LibreTranslate does, {"error": message}.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from urllib.parse import parse_qsl

from fastapi import Request

from ..errors import APIError

AUTO = "auto"  # LibreTranslate's source for "detect it"

# ISO 639-1 code -> (English name, ISO 639-2/3 code). Checkpoints name languages in several ways: M2M100 by
# 639-1 ("fr"), Marian's multilingual targets and NLLB by 639-3 ("fra", "fra_Latn"), mBART by 639-1 and a
# region ("fr_XX"). The second code lets a client that speaks 639-1, as LibreTranslate's clients do, reach them.
LANGUAGES = {
    "af": ("Afrikaans", "afr"), "ar": ("Arabic", "ara"), "az": ("Azerbaijani", "aze"), "be": ("Belarusian", "bel"),
    "bg": ("Bulgarian", "bul"), "bn": ("Bengali", "ben"), "bs": ("Bosnian", "bos"), "ca": ("Catalan", "cat"),
    "cs": ("Czech", "ces"), "cy": ("Welsh", "cym"), "da": ("Danish", "dan"), "de": ("German", "deu"),
    "el": ("Greek", "ell"), "en": ("English", "eng"), "eo": ("Esperanto", "epo"), "es": ("Spanish", "spa"),
    "et": ("Estonian", "est"), "eu": ("Basque", "eus"), "fa": ("Persian", "fas"), "fi": ("Finnish", "fin"),
    "fr": ("French", "fra"), "ga": ("Irish", "gle"), "gl": ("Galician", "glg"), "gu": ("Gujarati", "guj"),
    "he": ("Hebrew", "heb"), "hi": ("Hindi", "hin"), "hr": ("Croatian", "hrv"), "hu": ("Hungarian", "hun"),
    "hy": ("Armenian", "hye"), "id": ("Indonesian", "ind"), "is": ("Icelandic", "isl"), "it": ("Italian", "ita"),
    "ja": ("Japanese", "jpn"), "ka": ("Georgian", "kat"), "kk": ("Kazakh", "kaz"), "km": ("Khmer", "khm"),
    "ko": ("Korean", "kor"), "lt": ("Lithuanian", "lit"), "lv": ("Latvian", "lav"), "mk": ("Macedonian", "mkd"),
    "ml": ("Malayalam", "mal"), "mn": ("Mongolian", "mon"), "mr": ("Marathi", "mar"), "ms": ("Malay", "msa"),
    "my": ("Burmese", "mya"), "ne": ("Nepali", "nep"), "nl": ("Dutch", "nld"), "no": ("Norwegian", "nor"),
    "pa": ("Punjabi", "pan"), "pl": ("Polish", "pol"), "ps": ("Pashto", "pus"), "pt": ("Portuguese", "por"),
    "ro": ("Romanian", "ron"), "ru": ("Russian", "rus"), "si": ("Sinhala", "sin"), "sk": ("Slovak", "slk"),
    "sl": ("Slovenian", "slv"), "sq": ("Albanian", "sqi"), "sr": ("Serbian", "srp"), "sv": ("Swedish", "swe"),
    "sw": ("Swahili", "swa"), "ta": ("Tamil", "tam"), "te": ("Telugu", "tel"), "th": ("Thai", "tha"),
    "tl": ("Tagalog", "tgl"), "tr": ("Turkish", "tur"), "uk": ("Ukrainian", "ukr"), "ur": ("Urdu", "urd"),
    "uz": ("Uzbek", "uzb"), "vi": ("Vietnamese", "vie"), "xh": ("Xhosa", "xho"), "yo": ("Yoruba", "yor"),
    "zh": ("Chinese", "zho"), "zu": ("Zulu", "zul"), "am": ("Amharic", "amh"), "ba": ("Bashkir", "bak"),
    "br": ("Breton", "bre"), "ff": ("Fula", "ful"), "fy": ("Western Frisian", "fry"), "gd": ("Scottish Gaelic", "gla"),
    "ha": ("Hausa", "hau"), "ht": ("Haitian Creole", "hat"), "ig": ("Igbo", "ibo"), "jv": ("Javanese", "jav"),
    "kn": ("Kannada", "kan"), "lb": ("Luxembourgish", "ltz"), "lg": ("Ganda", "lug"), "ln": ("Lingala", "lin"),
    "lo": ("Lao", "lao"), "mg": ("Malagasy", "mlg"), "oc": ("Occitan", "oci"), "or": ("Odia", "ori"),
    "sd": ("Sindhi", "snd"), "so": ("Somali", "som"), "ss": ("Swati", "ssw"), "su": ("Sundanese", "sun"),
    "tn": ("Tswana", "tsn"), "wo": ("Wolof", "wol"), "yi": ("Yiddish", "yid"),
}
_BY_ISO3 = {iso3: code for code, (_, iso3) in LANGUAGES.items()}
# A code a checkpoint declares for its one pair (Marian's tokenizer_config.json): "en", "fra", "pt_BR". Group
# names such as "ROMANCE" or "mul" (several languages) restrict nothing.
DECLARED_CODE = re.compile(r"[a-z]{2,3}(_[A-Za-z]{2,4})?")
GROUP_CODES = {"mul"}


def language_name(code: str) -> str:
    """English name of a checkpoint's code ("fra_Latn" -> "French (Latn)"); an unknown code names itself."""
    base, _, variant = code.partition("_")
    known = LANGUAGES.get(base) or LANGUAGES.get(_BY_ISO3.get(base, ""))
    if known is None:
        return code
    return f"{known[0]} ({variant})" if variant and variant != "XX" else known[0]


def match_code(code: str, codes: list[str]) -> str | None:
    """The one code of `codes` that `code` names: itself, or a checkpoint's form of the same language ("fr" for
    "fra", "fra_Latn" or "fr_XX"); None when it names none of them, or several (zh: zho_Hans and zho_Hant)."""
    if code in codes:
        return code
    wanted = {code.lower()}
    if code.lower() in LANGUAGES:
        wanted.add(LANGUAGES[code.lower()][1])
    if code.lower() in _BY_ISO3:
        wanted.add(_BY_ISO3[code.lower()])
    found = [c for c in codes if c.lower() in wanted or c.partition("_")[0].lower() in wanted]
    return found[0] if len(found) == 1 else None


@dataclass
class TranslateRequest:
    texts: list[str]
    is_list: bool  # q was a list: the answer's translatedText is one too
    source: str  # a code or "auto"
    target: str
    alternatives: int  # extra translations wanted per text
    model: str | None  # Quill's extension: which hosted model translates


def bad_request(message: str) -> APIError:
    return APIError(400, message, reason="invalid_request")


async def read_fields(http: Request) -> dict[str, object]:
    """The request's fields: the query string's, then the body's over them (JSON object, urlencoded or multipart
    form). A field repeated in a form is a list (q=a&q=b), as a JSON list is."""
    fields: dict[str, object] = {}
    for key, value in http.query_params.multi_items():
        _add(fields, key, value)
    body = await http.body()
    media = http.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media == "application/json" or (not media and body.lstrip()[:1] == b"{"):
        try:
            parsed = json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise bad_request(f"the request body is not valid JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise bad_request("the JSON body must be an object of fields (q, source, target, ...)")
        fields.update(parsed)
    elif media == "multipart/form-data":
        for key, value in _multipart(http.headers["content-type"], body):
            _add(fields, key, value)
    elif body:
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise bad_request("the form is not valid UTF-8") from None
        for key, value in pairs:
            _add(fields, key, value)
    return fields


def _add(fields: dict, key: str, value: str) -> None:
    if key in fields and isinstance(fields[key], list):
        fields[key].append(value)
    elif key in fields:
        fields[key] = [fields[key], value]
    else:
        fields[key] = value


def _multipart(content_type: str, body: bytes) -> list[tuple[str, str]]:
    """A multipart/form-data body's text fields (files are not LibreTranslate's /translate)."""
    head = b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n"
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise bad_request("the multipart form could not be read")
    out = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            payload = part.get_payload(decode=True) or b""
            out.append((str(name), payload.decode(part.get_content_charset() or "utf-8", errors="replace")))
    return out


def _text_field(fields: dict, name: str, required: bool) -> str | None:
    value = fields.get(name)
    if value is None or value == "":
        if required:
            raise bad_request(f"Invalid request: missing {name} parameter")
        return None
    if not isinstance(value, str):
        raise bad_request(f"Invalid request: {name} must be a string, got {json.dumps(value)[:60]}")
    return value.strip()


def _alternatives(value) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, str) and value.strip().lstrip("+").isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise bad_request(f"Invalid request: alternatives must be an integer >= 0, got {json.dumps(value)[:60]}")


def parse_translate(fields: dict) -> TranslateRequest:
    """LibreTranslate's /translate fields, checked; api_key is left to the server's own key check."""
    q = fields.get("q")
    if q is None or q == "":
        raise bad_request("Invalid request: missing q parameter")
    is_list = isinstance(q, list)
    texts = q if is_list else [q]
    if is_list and not texts:
        raise bad_request("Invalid request: q is an empty list; send at least one text to translate")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            where = f"q[{i}]" if is_list else "q"
            raise bad_request(f"Invalid request: {where} must be a string, got {json.dumps(text)[:60]}")
    source = _text_field(fields, "source", required=True)
    target = _text_field(fields, "target", required=True)
    text_format = _text_field(fields, "format", required=False) or "text"
    if text_format == "html":
        raise bad_request("format html is not supported by this server: send plain text (format=text)")
    if text_format != "text":
        raise bad_request(f"Invalid request: format must be text, got {text_format!r}")
    model = _text_field(fields, "model", required=False)
    return TranslateRequest(list(texts), is_list, source, target, _alternatives(fields.get("alternatives")), model)

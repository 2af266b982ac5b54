"""Tiny encoder-decoder (translation) tokenizers, written as the hub ships them, offline and in well under a second.

Each writer trains SentencePiece (or a byte-level BPE, for BART; a fairseq BPE, for FSMT) on a few hundred generated
lines, then lets the family's own transformers tokenizer class save the files, so the directory holds what that
class writes: Marian's source.spm/target.spm/vocab.json, M2M100's sentencepiece.bpe.model/vocab.json, NLLB's and
mBART-50's tokenizer.json beside their sentencepiece.bpe.model, T5's tokenizer.json beside spiece.model, FSMT's
vocab-src.json/vocab-tgt.json/merges.txt. Vocabularies stay at
a few hundred tokens so that the models built on them stay tiny. Each writer returns what a model config needs.

transformers is imported inside the writers: it is a test dependency, and importing it costs a second.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import sentencepiece

from quill.models.text.sentencepiece_vocab import read_sentencepiece

# Words of three languages, with the accents, digits and punctuation a translation model meets.
ENGLISH = ("the a house is small and the garden was green today we will see you tomorrow morning "
           "my friend has three cats she reads books in the library after school they don't know why "
           "river city bridge window water bread coffee teacher student yesterday evening beautiful old new").split()
FRENCH = ("la le une maison est petite et le jardin était vert aujourd'hui nous verrons demain matin "
          "mon ami a trois chats elle lit des livres à la bibliothèque après l'école ils ne savent pas pourquoi "
          "rivière ville pont fenêtre eau pain café élève professeur hier soir très belle où déjà garçon").split()
GERMAN = ("das ein haus ist klein und der garten war grün heute wir sehen dich morgen früh "
          "mein freund hat drei katzen sie liest bücher in der bibliothek nach der schule sie wissen nicht warum "
          "fluss stadt brücke fenster wasser brot kaffee lehrer schüler gestern abend schön straße größer über").split()
PUNCTUATION = [".", ".", ".", "!", "?", ",", ";", ":", " -", "…"]


def corpus(words: list[str], lines: int = 300, seed: int = 0) -> list[str]:
    """Deterministic sentences: a capital, some numbers and quotes, end punctuation."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        sentence = [rng.choice(words) for _ in range(rng.randint(3, 12))]
        if rng.random() < 0.3:
            sentence.insert(rng.randrange(len(sentence)), str(rng.randint(0, 2030)))
        if rng.random() < 0.15:
            sentence.insert(rng.randrange(len(sentence)), f'"{rng.choice(words)}"')
        text = " ".join(sentence)
        out.append(text[0].upper() + text[1:] + rng.choice(PUNCTUATION))
    return out


def train_sentencepiece(path: Path, lines: list[str], vocab_size: int, model_type: str, **options) -> Path:
    """A SentencePiece model trained in memory and written to `path` (no other file is touched)."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type=model_type,
        character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2, **options,
    )
    path.write_bytes(model.getvalue())
    return path


def _special_pieces(types: list[int]) -> set[int]:
    return {i for i, kind in enumerate(types) if kind in (2, 3)}  # unknown, control


def write_marian_tokenizer(directory: Path, languages: list[str] | None = None, separate_vocabs: bool = False) -> dict:
    """Marian (opus-mt): an English source spm, a French/German target spm, and vocab.json laid out as Marian's
    own vocabularies are ("</s>" 0, "<unk>" 1, the language tokens, the pieces, "<pad>" last), not in spm order.
    `languages` (e.g. ["fra", "deu"]) makes it multilingual: ">>fra<<" tokens a source starts with."""
    from transformers import MarianTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    source_spm = train_sentencepiece(directory / "source.spm", corpus(ENGLISH, seed=1), 220, "unigram")
    target_spm = train_sentencepiece(directory / "target.spm", corpus(FRENCH + GERMAN, seed=2), 260, "unigram")
    codes = [f">>{code}<<" for code in languages or []]

    def layout(*models: Path, extra: list[str]) -> dict[str, int]:
        tokens = ["</s>", "<unk>"] + extra
        for model_path in models:
            spm = read_sentencepiece(model_path)
            skip = _special_pieces(spm.types)
            tokens += [p for i, p in enumerate(spm.pieces) if i not in skip and p not in tokens]
        return {token: i for i, token in enumerate(tokens + ["<pad>"])}

    kwargs = {}
    if separate_vocabs:
        vocab = layout(source_spm, extra=codes)
        target_vocab = layout(target_spm, extra=[])
        (directory / "target_vocab.json").write_text(json.dumps(target_vocab, ensure_ascii=False, indent=2))
        kwargs = dict(target_vocab_file=str(directory / "target_vocab.json"), separate_vocabs=True)
    else:
        vocab = target_vocab = layout(source_spm, target_spm, extra=codes)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2))
    tokenizer = MarianTokenizer(str(source_spm), str(target_spm), str(directory / "vocab.json"),
                                source_lang="en", target_lang="fr", **kwargs)
    tokenizer.save_pretrained(str(directory))
    pad = target_vocab["<pad>"]  # Marian's decoder starts with <pad>
    return {"vocab_size": len(target_vocab), "pad_token_id": pad, "eos_token_id": target_vocab["</s>"],
            "decoder_start_token_id": pad}


def write_m2m100_tokenizer(directory: Path, languages: tuple[str, ...] = ("en", "fr", "de")) -> dict:
    """M2M100: a BPE sentencepiece.bpe.model and a fairseq vocab.json ("<s>" 0, "<pad>" 1, "</s>" 2, "<unk>" 3,
    then the pieces in an order of their own, as fairseq's dictionary has them); transformers puts its 100
    language tokens after the vocabulary and 8 "madeup words" after those, which the model's embedding covers."""
    from transformers import M2M100Tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spm_path = train_sentencepiece(directory / "sentencepiece.bpe.model", corpus(ENGLISH + FRENCH + GERMAN, seed=3),
                                   300, "bpe")
    spm = read_sentencepiece(spm_path)
    skip = _special_pieces(spm.types)
    pieces = [p for i, p in enumerate(spm.pieces) if i not in skip]
    random.Random(4).shuffle(pieces)  # fairseq orders its dictionary by frequency: ids are not spm's
    vocab = {token: i for i, token in enumerate(["<s>", "<pad>", "</s>", "<unk>"] + pieces)}
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2))
    tokenizer = M2M100Tokenizer(str(directory / "vocab.json"), str(spm_path))
    tokenizer.save_pretrained(str(directory))
    lang_ids = {code: tokenizer.get_lang_id(code) for code in languages}
    return {"vocab_size": len(vocab) + len(tokenizer.lang_code_to_id) + tokenizer.num_madeup_words,
            "pad_token_id": vocab["<pad>"], "eos_token_id": vocab["</s>"], "decoder_start_token_id": vocab["</s>"],
            "lang_token_ids": lang_ids}


def _model_config(tokenizer, decoder_start: str, languages=()) -> dict:
    """What a model config built on `tokenizer` needs; `decoder_start` names the token the decoder starts with."""
    config = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
              "eos_token_id": tokenizer.eos_token_id,
              "decoder_start_token_id": tokenizer.convert_tokens_to_ids(decoder_start)}
    if languages:
        config["lang_token_ids"] = {code: tokenizer.convert_tokens_to_ids(code) for code in languages}
    return config


def write_nllb_tokenizer(directory: Path, languages: tuple[str, ...] = ("eng_Latn", "fra_Latn", "deu_Latn"),
                         legacy_behaviour: bool = False) -> dict:
    """NLLB-200: tokenizer.json (BPE) beside sentencepiece.bpe.model; only `languages` become language tokens
    (the real one has 202), after the pieces and before "<mask>" as in NLLB-200. `legacy_behaviour`: the source
    language goes after the text's </s>, not before the text."""
    from transformers import NllbTokenizer
    from transformers.tokenization_utils_base import generate_merges

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spm_path = train_sentencepiece(directory / "sentencepiece.bpe.model", corpus(ENGLISH + FRENCH + GERMAN, seed=5),
                                   300, "bpe")
    spm = read_sentencepiece(spm_path)
    # fairseq's layout: "<s>" 0, "<pad>" 1, "</s>" 2, "<unk>" 3, spm piece i (i >= 3) at i + 1; the merges are
    # those transformers derives from the pieces' order
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + spm.pieces[3:] + list(languages) + ["<mask>"]
    merges = generate_merges({piece: i for i, piece in enumerate(spm.pieces)})
    tokenizer = NllbTokenizer(vocab={token: i for i, token in enumerate(tokens)}, merges=merges,
                              vocab_file=str(spm_path), _spm_precompiled_charsmap=spm.precompiled_charsmap,
                              src_lang=languages[0], additional_special_tokens=list(languages),
                              legacy_behaviour=legacy_behaviour)
    tokenizer.save_pretrained(str(directory))
    return _model_config(tokenizer, "</s>", languages)


def _write_mbart(directory: Path, class_name: str, seed: int) -> dict:
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spm_path = train_sentencepiece(directory / "sentencepiece.bpe.model", corpus(ENGLISH + FRENCH + GERMAN, seed=seed),
                                   300, "unigram")
    spm = read_sentencepiece(spm_path)
    vocab = list(zip(spm.pieces, spm.scores))
    if class_name == "MBartTokenizer":  # it takes the vocabulary laid out, as transformers' converter makes it
        from transformers.models.mbart.tokenization_mbart import FAIRSEQ_LANGUAGE_CODES

        vocab = ([("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + vocab[3:]
                 + [(code, 0.0) for code in FAIRSEQ_LANGUAGE_CODES] + [("<mask>", 0.0)])
    tokenizer = getattr(transformers, class_name)(vocab=vocab, vocab_file=str(spm_path), src_lang="en_XX",
                                                  _spm_precompiled_charsmap=spm.precompiled_charsmap)
    tokenizer.save_pretrained(str(directory))
    return _model_config(tokenizer, "</s>", ("en_XX", "fr_XX", "de_DE"))


def write_mbart50_tokenizer(directory: Path) -> dict:
    """mBART-50: tokenizer.json (Unigram) beside sentencepiece.bpe.model; transformers puts all 52 language
    codes ("en_XX", ...) and "<mask>" after the pieces. The source language goes before the text."""
    return _write_mbart(directory, "MBart50Tokenizer", seed=6)


def write_mbart_tokenizer(directory: Path) -> dict:
    """mBART (cc25, MBartTokenizer): as mBART-50 with its first 25 codes; the source language goes after the
    text's </s>."""
    return _write_mbart(directory, "MBartTokenizer", seed=9)


def write_t5_tokenizer(directory: Path, extra_ids: int = 4) -> dict:
    """T5: tokenizer.json (Unigram) beside spiece.model ("<pad>" 0, "</s>" 1, "<unk>" 2, as T5's own), with
    `extra_ids` sentinel tokens (the real one has 100) after the pieces, "<extra_id_0>" last."""
    from transformers import T5Tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spm_path = train_sentencepiece(directory / "spiece.model", corpus(ENGLISH + GERMAN, seed=7), 260, "unigram",
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    spm = read_sentencepiece(spm_path)
    sentinels = [f"<extra_id_{i}>" for i in range(extra_ids - 1, -1, -1)]
    tokenizer = T5Tokenizer(vocab=list(zip(spm.pieces, spm.scores)) + [(s, 0.0) for s in sentinels],
                            vocab_file=str(spm_path), _spm_precompiled_charsmap=spm.precompiled_charsmap,
                            extra_ids=extra_ids, additional_special_tokens=sentinels)
    tokenizer.save_pretrained(str(directory))
    return _model_config(tokenizer, "<pad>")


def write_bart_tokenizer(directory: Path) -> dict:
    """BART: byte-level BPE (tokenizer.json, and vocab.json with merges.txt as the hub also ships them) with "<s>" 0,
    "<pad>" 1, "</s>" 2, "<unk>" 3 and "<mask>" last. BART's decoder starts with "</s>", then is forced to "<s>"
    (forced_bos_token_id, also returned, with bos_token_id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import BartTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    trained.train_from_iterator(corpus(ENGLISH, seed=8), trainer)
    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    vocab["<mask>"] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    tokenizer = BartTokenizer(vocab=vocab, merges=merges)
    tokenizer.save_pretrained(str(directory))
    config = _model_config(tokenizer, "</s>")
    return {**config, "bos_token_id": tokenizer.bos_token_id, "forced_bos_token_id": tokenizer.bos_token_id}


# Lines with what Moses' rules act on: quotes, apostrophes, brackets, dashes, currency, entities, numbers.
FSMT_EXTRA = {
    "en": ['He said "hello" to me.', "It's John's book (the old one), isn't it?",
           "A well-known 10-year-old pays $5.50 - 20% off!", "Tom & Jerry <b>bold</b> [x] {y} | z < 3 > 2",
           "Don't, won't, can't; I'm here: 1,000,000 and 3.14.", "'single quotes' and `backticks` ...",
           "e-mail me@example.com #tag ~tilde ^ * = +", "The Jones' house."],
    "de": ["Er sagte „hallo“ zu mir.", "Das ist Johns Buch (das alte), nicht wahr?",
           "Ein 10-jähriges Kind zahlt 5,50 € - 20 % Rabatt!", "Tom & Jerry <b>fett</b> [x] {y} | z < 3 > 2",
           "Ich bin's, gibt's das? 1.000.000 und 3,14.", "'einfache' und \"doppelte\" Anführungszeichen ...",
           "E-Mail an mich@beispiel.de #tag ~ ^ * = +"],
}


def write_fsmt_tokenizer(directory: Path, langs: tuple[str, str] = ("en", "de")) -> dict:
    """FSMT (fairseq's WMT19): one BPE (merges.txt, "</w>" ending a word) learned on both languages' Moses-tokenized
    lines, and a fairseq dictionary per side ("<s>" 0, "<pad>" 1, "</s>" 2, "<unk>" 3, then the tokens that side's
    lines use, most frequent first), so some merges make tokens a side lacks, as in the real checkpoints."""
    from collections import Counter

    from sacremoses import MosesPunctNormalizer, MosesTokenizer
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import FSMTTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    words = {"en": ENGLISH, "fr": FRENCH, "de": GERMAN}
    tokenized = {}
    for seed, lang in enumerate(langs, 12):
        normalizer, moses = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
        # the extra lines repeated, so that Moses' XML entities (&quot; &apos; &amp; &lt; &gt;) are whole tokens,
        # as in the real vocabularies
        lines = corpus(words.get(lang, ENGLISH), seed=seed) + FSMT_EXTRA.get(lang, []) * 8
        tokenized[lang] = [moses.tokenize(normalizer.normalize(line), aggressive_dash_splits=True, escape=True)
                           for line in lines]
    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=420, end_of_word_suffix="</w>", show_progress=False)
    bpe.train_from_iterator([" ".join(line) for lang in langs for line in tokenized[lang]], trainer)
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(bpe.to_str())["model"]["merges"]]
    (directory / "merges.txt").write_text("".join(f"{m}\n" for m in merges), encoding="utf-8")
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    for lang, name in zip(langs, ("vocab-src.json", "vocab-tgt.json")):
        counts = Counter(t.value for line in tokenized[lang] for word in line for t in bpe.model.tokenize(word))
        tokens = specials + sorted(counts, key=lambda t: (-counts[t], t))
        (directory / name).write_text(json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False))
    tokenizer = FSMTTokenizer(langs=list(langs), src_vocab_file=str(directory / "vocab-src.json"),
                              tgt_vocab_file=str(directory / "vocab-tgt.json"),
                              merges_file=str(directory / "merges.txt"))
    tokenizer.save_pretrained(str(directory))
    assert FSMTTokenizer.from_pretrained(str(directory)).tgt_lang == langs[1]
    eos = tokenizer.sep_token_id
    return {"src_vocab_size": tokenizer.src_vocab_size, "tgt_vocab_size": tokenizer.tgt_vocab_size,
            "pad_token_id": tokenizer.pad_token_id, "eos_token_id": eos, "decoder_start_token_id": eos}

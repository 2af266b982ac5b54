// Encoder-decoder (translation, summarization) models on the page: their /v1/models entry says
// "encoder_decoder": true, lists the language codes they take ("languages", maybe none) and how many source
// tokens their encoder reads ("max_source_len"). The prompt box then holds the source text, and the source and
// target language selectors add source_lang / target_lang to the completions body, each only when picked: some
// checkpoints need no source language (Marian), others refuse a request without one (M2M100, NLLB), and the
// server's message says which.

const $ = (id) => document.getElementById(id);
const UNSET = "";

export function isEncoderDecoder(model) {
  return Boolean(model && model.encoder_decoder);
}

/** The model selector's text for a model. */
export function modelLabel(model) {
  if (model.chat) return `${model.id} (chat)`;
  return isEncoderDecoder(model) ? `${model.id} (encoder-decoder)` : model.id;
}

/** Refill a language selector, keeping its choice when the new list has it. */
function fill(select, codes, unsetLabel) {
  const previous = select.value;
  select.replaceChildren(new Option(unsetLabel, UNSET), ...codes.map((code) => new Option(code, code)));
  select.value = codes.includes(previous) ? previous : UNSET;
}

function note(model, mode) {
  if (mode === "score") {
    return "Score is not available for an encoder-decoder model: it needs echo, and such a model's prompt is its"
      + " encoder's source, not text it generates.";
  }
  const limit = Number.isInteger(model.max_source_len) ? ` (at most ${model.max_source_len} tokens)` : "";
  const languages = (model.languages || []).length > 0
    ? " Source language: leave it unset where the model needs none; the server says when it does."
    : " It takes no language codes.";
  return `Encoder-decoder model: the answer is generated from the source text${limit}, not appended to it.`
    + ` No chat (no chat template).${languages}`;
}

/** Show the source/target selectors and the note for `model` (null: none chosen), or hide them. */
export function showSeq2Seq(model, mode) {
  const box = $("seq2seq-box");
  box.hidden = !isEncoderDecoder(model);
  if (box.hidden) return;
  $("seq2seq-note").textContent = note(model, mode);
  if (mode !== "score") $("prompt-label").textContent = "Source text";
  const codes = model.languages || [];
  $("lang-box").hidden = codes.length === 0 || mode === "score";
  if (box.dataset.model !== model.id) {  // refilled when the model changes, so a picked language stays put
    box.dataset.model = model.id;
    fill($("source_lang"), codes, "(not set)");
    fill($("target_lang"), codes, "(not set)");
  }
}

/** A result card's title part for an encoder-decoder's request (its languages); null for another model. */
export function sourceTitle(model, body) {
  if (!isEncoderDecoder(model)) return null;
  if (!body.target_lang) return "source text";
  return `${body.source_lang ? `${body.source_lang} ` : ""}→ ${body.target_lang}`;
}

/** The language fields of a completions body: those the user picked, for the encoder-decoder model shown. */
export function languageFields() {
  if ($("seq2seq-box").hidden || $("lang-box").hidden) return {};
  const fields = {};
  for (const id of ["source_lang", "target_lang"]) {
    if ($(id).value !== UNSET) fields[id] = $(id).value;
  }
  return fields;
}

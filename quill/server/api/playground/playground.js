// The playground page: pick a model, write a prompt (or chat messages), set the decoding, and watch
// the answer stream in with each token coloured by its probability. Three modes: Generate (one
// request), Compare (the same prompt under two to four decoding settings at once) and Score (the
// log-probability of every token of a given text, and its perplexity). api.js does the HTTP; seq2seq.js
// the source text and languages of encoder-decoder (translation) models.

import {ApiError, ROUTES, getJson, getText, perplexity, postJson, postStream, scoreBody, scoredTokens} from "./api.js";
import {isEncoderDecoder, languageFields, modelLabel, showSeq2Seq, sourceTitle} from "./seq2seq.js";

const KEY_STORAGE = "quill-playground-api-key";  // sessionStorage: this tab only, gone when it closes
const METRICS_EVERY_MS = 1000;
const NARROW = "(max-width: 760px)";  // the CSS breakpoint where the results go below the input
const MAX_PANES = 4;
const MIN_PANES = 2;

// The settings form: input id -> request field and number kind. beam_width is the page's name for
// vLLM's pair (use_beam_search, best_of); "scope" says which modes show the field.
const NUMBER_FIELDS = [
  {id: "max_tokens", kind: "int", scope: "shared"},
  {id: "temperature", kind: "float", scope: "decoding"},
  {id: "top_k", kind: "int", scope: "decoding"},
  {id: "top_p", kind: "float", scope: "decoding"},
  {id: "min_p", kind: "float", scope: "decoding"},
  {id: "repetition_penalty", kind: "float", scope: "decoding"},
  {id: "presence_penalty", kind: "float", scope: "decoding"},
  {id: "frequency_penalty", kind: "float", scope: "decoding"},
  {id: "seed", kind: "int", scope: "shared"},
  {id: "n", kind: "int", scope: "decoding"},
  {id: "beam_width", kind: "int", scope: "decoding"},
  {id: "length_penalty", kind: "float", scope: "decoding"},
  {id: "min_tokens", kind: "int", scope: "shared"},
];
const SCOPES_SHOWN = {generate: ["shared", "decoding", "constraint"], compare: ["shared"], score: ["score"]};
const RUN_LABELS = {generate: "Generate", compare: "Compare", score: "Score"};

// Decoding settings by name, in the API's own fields (so a pane's JSON reads like a request).
const PRESETS = {
  greedy: {label: "Greedy", settings: {temperature: 0}},
  topk: {label: "Top-k 40", settings: {temperature: 1, top_k: 40}},
  topp: {label: "Top-p 0.9", settings: {temperature: 1, top_p: 0.9}},
  minp: {label: "Min-p 0.1", settings: {temperature: 1, min_p: 0.1}},
  hot: {label: "Temperature 1.5", settings: {temperature: 1.5}},
  beam: {label: "Beam 4", settings: {use_beam_search: true, best_of: 4, temperature: 0}},
};
const DEFAULT_PANES = ["greedy", "topk", "topp", "beam"];

/** A value the page cannot put in a request (text in a number field); shown like a server error. */
class InputError extends Error {}

const $ = (id) => document.getElementById(id);

// ---- page state ---------------------------------------------------------------------------------

function newState() {
  return {
    mode: "generate",
    models: [],
    apiKey: sessionStorage.getItem(KEY_STORAGE) || "",
    controllers: new Set(),  // one per request in flight; Stop aborts them all
    tokensOf: new WeakMap(),  // token span -> the tokens (with alternatives) it shows
    tipShown: 0,  // counts tips shown, so an answer about the grammar lands only on the tip that asked
  };
}

function currentModel(state) {
  return state.models.find((m) => m.id === $("model").value) || null;
}

/** "chat" when the chosen model has a chat template and the Chat switch is on; else "completion". */
function currentRoute(state) {
  const model = currentModel(state);
  if (state.mode === "score" || !model || !model.chat) return "completion";
  return document.querySelector("input[name=kind]:checked").value === "chat" ? "chat" : "completion";
}

// ---- reading the form -----------------------------------------------------------------------------

function fieldLabel(input) {
  return input.closest("label").firstChild.textContent.trim();
}

/** A number field's value, null when empty. Range checks are the server's: its message says what is wrong. */
function readNumber(input, kind) {
  if (input.validity.badInput) throw new InputError(`${fieldLabel(input)}: not a number`);
  const raw = input.value.trim();
  if (raw === "") return null;
  const value = Number(raw);
  if (kind === "int" && Number.isInteger(value) && !Number.isSafeInteger(value)) {
    throw new InputError(`${fieldLabel(input)}: a browser sends integers exactly only up to 2^53`);
  }
  return value;
}

/** Stop strings: one per line, with \n, \t and \\ escapes so a stop string can hold a newline. */
function readStops() {
  const unescape = (line) => line.replace(/\\([nt\\])/g, (_, c) => ({n: "\n", t: "\t", "\\": "\\"})[c]);
  return $("stop").value.split("\n").filter((line) => line !== "").map(unescape);
}

/** The request fields the form sets, for the given scopes; fields left empty are left out. */
function readSettings(scopes) {
  const settings = {};
  for (const field of NUMBER_FIELDS) {
    if (!scopes.includes(field.scope)) continue;
    const value = readNumber($(field.id), field.kind);
    if (value === null) continue;
    if (field.id === "beam_width") {
      settings.use_beam_search = true;
      settings.best_of = value;
    } else {
      settings[field.id] = value;
    }
  }
  if (scopes.includes("decoding")) {
    const stops = readStops();
    if (stops.length > 0) settings.stop = stops;
  }
  if (scopes.includes("shared") && $("ignore_eos").checked) settings.ignore_eos = true;
  if (scopes.includes("shared")) Object.assign(settings, languageFields());  // an encoder-decoder's languages
  if (scopes.includes("constraint")) {
    const constraint = readConstraint();
    if (constraint !== null) settings.structured_outputs = constraint;
  }
  return settings;
}

/** The constraint's text box, shown while a kind of constraint is chosen (in Generate mode). */
function updateConstraintBox(state) {
  $("constraint-box").hidden = state.mode !== "generate" || $("constraint_kind").value === "";
}

/** vLLM's structured_outputs for the constraint fields ({json: schema} or {regex: pattern}); null: none. */
function readConstraint() {
  const kind = $("constraint_kind").value;
  if (kind === "") return null;
  const text = $("constraint").value;
  if (kind === "regex") return {regex: text};
  try {
    return {json: JSON.parse(text)};
  } catch (error) {
    throw new InputError(`the JSON schema is not valid JSON: ${error.message}`);
  }
}

function readAlternatives() {
  return readNumber($("alternatives"), "int");
}

function readMessages() {
  return [...$("messages").querySelectorAll(".message")]
    .map((row) => ({role: row.querySelector("select").value, content: row.querySelector("textarea").value}))
    .filter((m) => m.content.trim() !== "");
}

function readInput(route) {
  return route === "chat" ? readMessages() : $("prompt").value;
}

// ---- presets ------------------------------------------------------------------------------------

/** Fill the decoding fields from a preset's API settings (the rest emptied). */
function applyPreset(name) {
  for (const field of NUMBER_FIELDS) if (field.scope === "decoding") $(field.id).value = "";
  $("stop").value = "";
  const settings = name in PRESETS ? PRESETS[name].settings : {};
  for (const [key, value] of Object.entries(settings)) {
    if (key === "use_beam_search") continue;
    $(key === "best_of" ? "beam_width" : key).value = String(value);
  }
}

function presetMatching(settings) {
  const text = JSON.stringify(settings);
  return Object.keys(PRESETS).find((name) => JSON.stringify(PRESETS[name].settings) === text) || null;
}

// ---- compare panes ------------------------------------------------------------------------------

function addPaneSetting(presetName) {
  const row = $("pane-row").content.firstElementChild.cloneNode(true);
  const select = row.querySelector("select");
  const input = row.querySelector("input");
  for (const [name, preset] of Object.entries(PRESETS)) select.add(new Option(preset.label, name));
  select.add(new Option("Custom", "custom"));
  select.value = presetName;
  input.value = JSON.stringify(PRESETS[presetName].settings);
  select.addEventListener("change", () => {
    if (select.value in PRESETS) input.value = JSON.stringify(PRESETS[select.value].settings);
  });
  input.addEventListener("input", () => {
    try {
      select.value = presetMatching(JSON.parse(input.value)) || "custom";
    } catch {
      select.value = "custom";
    }
  });
  row.querySelector(".remove").addEventListener("click", () => {
    row.remove();
    updatePaneButtons();
  });
  $("pane-settings").append(row);
  updatePaneButtons();
}

function updatePaneButtons() {
  const rows = $("pane-settings").children;
  $("add-pane").disabled = rows.length >= MAX_PANES;
  for (const row of rows) row.querySelector(".remove").disabled = rows.length <= MIN_PANES;
}

/** Each pane's title and settings; a pane's JSON must be an object of request fields. */
function readPanes() {
  return [...$("pane-settings").children].map((row, i) => {
    const text = row.querySelector("input").value;
    let settings;
    try {
      settings = JSON.parse(text);
    } catch (e) {
      throw new InputError(`pane ${i + 1}: not JSON (${e.message})`);
    }
    if (settings === null || typeof settings !== "object" || Array.isArray(settings)) {
      throw new InputError(`pane ${i + 1}: settings must be a JSON object, such as {"temperature": 0}`);
    }
    const preset = presetMatching(settings);
    return {title: preset ? PRESETS[preset].label : text, settings};
  });
}

// ---- chat messages ------------------------------------------------------------------------------

function addMessage(role = "user", content = "") {
  const row = $("message-row").content.firstElementChild.cloneNode(true);
  row.querySelector("select").value = role;
  row.querySelector("textarea").value = content;
  row.querySelector(".remove").addEventListener("click", () => row.remove());
  row.querySelector("textarea").addEventListener("keydown", runOnCtrlEnter);
  $("messages").append(row);
  return row;
}

// ---- drawing tokens -----------------------------------------------------------------------------

/** Probability band of a token (the legend's five colours); "pn": no probability (a text's first token). */
function band(logprob) {
  if (logprob === null || logprob === undefined) return "pn";
  const p = Math.exp(logprob);
  if (p >= 0.5) return "p4";
  if (p >= 0.2) return "p3";
  if (p >= 0.05) return "p2";
  if (p >= 0.01) return "p1";
  return "p0";
}

/** Whitespace made visible, for token texts shown on their own. */
function visible(text) {
  if (text === "") return "∅";
  return text.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥");
}

function percent(logprob) {
  const p = 100 * Math.exp(logprob);
  return p >= 10 ? `${p.toFixed(0)}%` : p >= 0.1 ? `${p.toFixed(1)}%` : `${p.toPrecision(1)}%`;
}

/**
 * A span showing `text` for `tokens`. It shows the server's text, not the tokens' own texts joined,
 * so what is on screen is the completion exactly: they differ when a character is split across
 * tokens, for special tokens (no text; their name is drawn by CSS, outside textContent) and where a
 * stop string was cut.
 */
function tokenSpan(state, text, tokens) {
  const span = document.createElement("span");
  const logprobs = tokens.map((t) => t.logprob);
  const joint = logprobs.some((lp) => lp === null || lp === undefined) ? null : logprobs.reduce((a, b) => a + b, 0);
  span.className = `tok ${band(joint)}`;
  span.textContent = text;
  if (text === "") {
    span.classList.add("special");
    span.dataset.label = tokens.map((t) => t.text).join("");
  }
  if (text.includes("\n")) span.classList.add("newline");
  state.tokensOf.set(span, tokens);
  return span;
}

/** Append a streamed piece to a choice's text: one span per token when the texts line up, else one for all. */
function drawPiece(state, target, piece) {
  const tokens = piece.tokens && piece.tokens.length > 0 ? piece.tokens : null;
  if (tokens === null) {
    if (piece.text) target.append(plainSpan(piece.text));
  } else if (tokens.map((t) => t.text).join("") === piece.text) {
    for (const token of tokens) target.append(tokenSpan(state, token.text, [token]));
  } else {
    target.append(tokenSpan(state, piece.text, tokens));
  }
}

function plainSpan(text) {
  const span = document.createElement("span");
  span.className = "plain";
  span.textContent = text;
  return span;
}

// ---- the alternatives tip (hover with a mouse, tap on a touch screen) ------------------------------

function tipSection(token) {
  const section = document.createElement("section");
  const head = document.createElement("p");
  const code = document.createElement("code");
  code.textContent = visible(token.text);
  head.append(code, token.logprob === null || token.logprob === undefined
    ? " first token: nothing before it to predict it from"
    : ` p = ${percent(token.logprob)}, log p = ${token.logprob.toFixed(3)}`);
  section.append(head);
  if (token.top.length === 0) return section;
  const list = document.createElement("ol");
  for (const [text, logprob] of token.top) {
    const item = document.createElement("li");
    if (text === token.text) item.className = "chosen";
    const alt = document.createElement("code");
    alt.textContent = visible(text);
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.setProperty("--w", `${Math.max(1, 100 * Math.exp(logprob))}%`);
    const value = document.createElement("span");
    value.className = "value";
    value.textContent = percent(logprob);
    item.append(alt, bar, value);
    list.append(item);
  }
  section.append(list);
  return section;
}

/** Give a constrained answer's tokens what the tip needs to ask which alternatives the grammar allowed. */
function noteGrammar(grammar, textBefore, tokens) {
  let before = textBefore;
  for (const token of tokens || []) {
    token.grammar = {...grammar, before};
    before += token.text;
  }
}

/** Strike through the alternatives the grammar forbade and say how many tokens it allowed (one request per token). */
async function markAllowed(state, shown, sections, tokens) {
  for (const [i, token] of tokens.entries()) {
    if (!token.grammar || token.top.length === 0) continue;
    const {model, structured_outputs, before} = token.grammar;
    let answer;
    try {
      answer = await postJson("v1/structured/allowed", {
        model, structured_outputs, text: before, alternatives: token.top.map(([text]) => text),
      }, state.apiKey);
    } catch {
      return;  // the tip stays as it is: the colours and probabilities do not depend on this
    }
    if (state.tipShown !== shown) return;
    const items = sections[i].querySelectorAll("li");
    answer.allowed.forEach((allowed, j) => items[j] && items[j].classList.toggle("forbidden", !allowed));
    const note = document.createElement("p");
    note.className = "grammar";
    note.textContent = answer.text_follows
      ? `the grammar allowed ${answer.num_allowed} of ${answer.vocab_size} tokens here; struck through: forbidden`
      : "the grammar's place here could not be found from the text";
    sections[i].append(note);
  }
}

function showTip(span, tokens, state) {
  const tip = $("tip");
  const sections = tokens.map(tipSection);
  tip.replaceChildren(...sections);
  state.tipShown += 1;
  if (tokens.some((t) => t.grammar)) markAllowed(state, state.tipShown, sections, tokens);
  tip.hidden = false;
  placeTip(span);
}

/** Put the tip under the token (above it when there is no room below), within the window. */
function placeTip(span) {
  const tip = $("tip");
  const box = span.getBoundingClientRect();
  const width = tip.offsetWidth;
  const left = Math.min(Math.max(4, box.left), window.innerWidth - width - 4);
  const below = box.bottom + 6;
  const top = below + tip.offsetHeight > window.innerHeight && box.top > tip.offsetHeight + 6
    ? box.top - tip.offsetHeight - 6 : below;
  tip.style.setProperty("left", `${left}px`);
  tip.style.setProperty("top", `${top}px`);
}

function hideTip() {
  $("tip").hidden = true;
}

function installTips(state, container) {
  let pinned = null;  // the token tapped or clicked: its tip stays until another tap
  const tokenAt = (event) => {
    const span = event.target.closest(".tok");
    return span && state.tokensOf.has(span) ? span : null;
  };
  container.addEventListener("pointerover", (event) => {
    const span = tokenAt(event);
    if (event.pointerType === "mouse" && pinned === null && span) showTip(span, state.tokensOf.get(span), state);
  });
  container.addEventListener("pointerout", (event) => {
    if (event.pointerType === "mouse" && pinned === null && tokenAt(event)) hideTip();
  });
  document.addEventListener("click", (event) => {
    const span = container.contains(event.target) ? tokenAt(event) : null;
    if (span === null && $("tip").contains(event.target)) return;
    pinned = span === pinned ? null : span;
    if (pinned) showTip(pinned, state.tokensOf.get(pinned), state);
    else hideTip();
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      pinned = null;
      hideTip();
    }
  });
  // The tip is placed for where the token was: a pinned one follows its token (a tap may scroll the page as it
  // lands, and the scroll event can come after the click), a hovered one goes.
  window.addEventListener("scroll", () => {
    if (pinned !== null && pinned.isConnected) placeTip(pinned);
    else hideTip();
  }, {passive: true});
}

// ---- result cards -------------------------------------------------------------------------------

/** Timing of one request as the browser sees it: time to first token, then tokens per second. */
class Timing {
  constructor() {
    this.start = performance.now();
    this.first = null;
    this.last = null;
    this.tokens = 0;
    this.tokensAtFirst = 0;
  }

  add(count) {
    if (count === 0) return;
    const now = performance.now();
    if (this.first === null) {
      this.first = now;
      this.tokensAtFirst = count;
    }
    this.last = now;
    this.tokens += count;
  }

  /** Tokens after the first arrival over the time they took; when all came at once (beam search), over the whole request. */
  tokensPerSecond() {
    if (this.first === null) return null;
    if (this.last > this.first && this.tokens > this.tokensAtFirst) {
      return (this.tokens - this.tokensAtFirst) / ((this.last - this.first) / 1000);
    }
    return this.tokens / ((this.last - this.start) / 1000);
  }

  describe() {
    if (this.first === null) return "waiting for the first token";
    const parts = [`TTFT ${Math.round(this.first - this.start)} ms`, `${this.tokens} tokens`];
    const rate = this.tokensPerSecond();
    if (rate !== null && Number.isFinite(rate)) parts.push(`${rate.toFixed(1)} tokens/s`);
    return parts.join(" · ");
  }
}

function newCard(title) {
  const root = $("card").content.firstElementChild.cloneNode(true);
  root.querySelector("h2").textContent = title;
  $("outputs").append(root);
  // Stacked on a phone, the results are below the form: bring the first one into view.
  if (window.matchMedia(NARROW).matches && $("outputs").children.length === 1) root.scrollIntoView({block: "nearest"});
  return {root, choices: new Map(), timing: new Timing(), finish: new Map(), echo: null};
}

function setCardState(card, value) {
  card.root.dataset.state = value;
}

/** The text element of choice `index` of a card, made on first use (n > 1 gives several). */
function choiceText(card, index) {
  if (!card.choices.has(index)) {
    const choice = document.createElement("div");
    choice.className = "choice";
    choice.dataset.index = String(index);
    const label = document.createElement("span");
    label.className = "choice-label";
    label.textContent = `#${index + 1}`;
    const text = document.createElement("div");
    text.className = "text";
    if (card.echo !== null) {
      const echo = document.createElement("span");
      echo.className = "echo";
      echo.textContent = card.echo;
      text.append(echo);
    }
    const gen = document.createElement("span");
    gen.className = "gen";
    text.append(gen);
    choice.append(label, text);
    const choices = card.root.querySelector(".choices");
    const after = [...choices.children].find((c) => Number(c.dataset.index) > index);
    choices.insertBefore(choice, after || null);
    card.choices.set(index, gen);
  }
  return card.choices.get(index);
}

function updateStats(card, note = "") {
  const finishes = [...new Set(card.finish.values())];
  const parts = [card.timing.describe()];
  if (finishes.length > 0) parts.push(`finish: ${finishes.join(", ")}`);
  if (note) parts.push(note);
  card.root.querySelector(".stats").textContent = parts.join(" · ");
}

function showCardError(card, error) {
  const box = card.root.querySelector(".card-error");
  box.replaceChildren();
  if (error instanceof ApiError) {
    const status = document.createElement("b");
    status.textContent = String(error.status);
    box.append(status, " ");
  }
  box.append(error.message);  // as the server wrote it
  box.hidden = false;
  setCardState(card, "error");
}

// ---- running requests -----------------------------------------------------------------------------

function describeRequest(requests) {
  const base = document.baseURI;
  $("request-view").textContent = requests.map(({path, body}) => {
    const url = new URL(path, base).href;
    const json = JSON.stringify(body);
    const auth = $("key-state").dataset.set ? ` -H "Authorization: Bearer $QUILL_API_KEY"` : "";
    const curl = `curl -sN ${url} -H 'Content-Type: application/json'${auth} -d '${json.replace(/'/g, "'\\''")}'`;
    return `POST ${path}\n${JSON.stringify(body, null, 2)}\n\n${curl}`;
  }).join("\n\n");
}

function startRequest(state) {
  const controller = new AbortController();
  state.controllers.add(controller);
  return controller;
}

function isAbort(error) {
  return error && error.name === "AbortError";
}

/** Stream one request into a card: pieces drawn as they come, timing and usage kept up to date. */
async function streamInto(state, card, route, body) {
  const controller = startRequest(state);
  try {
    for await (const payload of postStream(route.path, body, state.apiKey, controller.signal)) {
      for (const piece of route.pieces(payload)) {
        card.timing.add(piece.tokens && piece.tokens.length > 0 ? piece.tokens.length : piece.text ? 1 : 0);
        const target = choiceText(card, piece.index);
        if (card.grammar) noteGrammar(card.grammar, target.textContent, piece.tokens);
        drawPiece(state, target, piece);
        if (piece.finish) card.finish.set(piece.index, piece.finish);
      }
      if (payload.usage) card.timing.tokens = payload.usage.completion_tokens;
      updateStats(card);
    }
    setCardState(card, "done");
    updateStats(card);
  } catch (error) {
    if (isAbort(error)) {
      setCardState(card, "stopped");
      updateStats(card, "stopped");
    } else {
      showCardError(card, error);
    }
  } finally {
    state.controllers.delete(controller);
  }
}

/** A finished card with text but no token colours: say why (beam search reports no per-token log-probabilities). */
function explainPlainText(card) {
  const plain = card.root.querySelector(".plain") !== null && card.root.querySelector(".tok") === null;
  if (plain && card.root.dataset.state === "done") {
    card.root.querySelector(".card-foot").textContent = "No per-token probabilities came with this text: beam"
      + " search reports none, and none are asked for while \"Alternatives shown\" is empty.";
  }
}

function offerReply(card) {
  const gen = card.choices.get(0);
  if (!gen || card.root.dataset.state !== "done") return;
  const button = document.createElement("button");
  button.type = "button";
  button.textContent = "Add the reply to the conversation";
  button.addEventListener("click", () => {
    addMessage("assistant", gen.textContent);
    addMessage("user", "").querySelector("textarea").focus();
    button.remove();
  });
  card.root.querySelector(".card-foot").append(button);
}

async function runGenerate(state) {
  const routeName = currentRoute(state);
  const route = ROUTES[routeName];
  const input = readInput(routeName);
  const body = route.body($("model").value, input, readSettings(SCOPES_SHOWN.generate), readAlternatives());
  describeRequest([{path: route.path, body}]);
  const model = currentModel(state);
  const kind = routeName === "chat" ? "chat" : sourceTitle(model, body) ?? "prompt";
  const card = newCard(`${$("model").value} · ${kind}`);
  if (routeName === "completion" && !isEncoderDecoder(model)) card.echo = input;  // its answer does not continue the source
  if (body.structured_outputs) card.grammar = {model: body.model, structured_outputs: body.structured_outputs};
  await streamInto(state, card, route, body);
  explainPlainText(card);
  if (routeName === "chat") offerReply(card);
}

async function runCompare(state) {
  const routeName = currentRoute(state);
  const route = ROUTES[routeName];
  const input = readInput(routeName);
  const shared = readSettings(SCOPES_SHOWN.compare);
  const alternatives = readAlternatives();
  const panes = readPanes().map((pane) => ({
    ...pane, body: route.body($("model").value, input, {...shared, ...pane.settings}, alternatives),
  }));
  describeRequest(panes.map((pane) => ({path: route.path, body: pane.body})));
  $("outputs").classList.add("side-by-side");
  $("outputs").dataset.panes = String(panes.length);
  await Promise.all(panes.map((pane) => {
    const card = newCard(pane.title);
    card.root.classList.add("pane");
    return streamInto(state, card, route, pane.body).then(() => explainPlainText(card));
  }));
}

function scoreTable(tokens) {
  const table = document.createElement("table");
  table.className = "score-table";
  const head = table.createTHead().insertRow();
  for (const name of ["#", "token", "log p", "p", "most likely instead"]) {
    const th = document.createElement("th");
    th.textContent = name;
    head.append(th);
  }
  const body = table.createTBody();
  tokens.forEach((token, i) => {
    const row = body.insertRow();
    const best = token.top.find(([text]) => text !== token.text);
    const has = token.logprob !== null && token.logprob !== undefined;
    const cells = [String(i + 1), visible(token.text), has ? token.logprob.toFixed(3) : "-", has ? percent(token.logprob) : "-",
      best ? `${visible(best[0])} (${percent(best[1])})` : "-"];
    for (const value of cells) row.insertCell().textContent = value;
    row.cells[2].className = `num ${band(token.logprob)}`;
  });
  return table;
}

async function runScore(state) {
  const alternatives = readAlternatives() ?? 0;
  const body = scoreBody($("model").value, $("prompt").value, alternatives);
  describeRequest([{path: "v1/completions", body}]);
  const card = newCard(`${$("model").value} · score`);
  card.root.classList.add("score");
  const controller = startRequest(state);
  try {
    const answer = await postJson("v1/completions", body, state.apiKey, controller.signal);
    const tokens = scoredTokens(answer);
    const gen = choiceText(card, 0);
    for (const token of tokens) gen.append(tokenSpan(state, token.text, [token]));
    const summary = perplexity(tokens);
    card.root.querySelector(".stats").textContent = summary.scored === 0
      ? `${tokens.length} token: nothing to score (the first token has no context)`
      : `${tokens.length} tokens · ${summary.scored} scored · log p ${summary.total.toFixed(2)} · `
        + `mean ${summary.mean.toFixed(3)} · perplexity ${summary.perplexity.toFixed(2)}`;
    card.root.dataset.perplexity = summary.perplexity === null ? "" : String(summary.perplexity);
    const details = document.createElement("details");
    const summaryLine = document.createElement("summary");
    summaryLine.textContent = "Per-token log-probabilities";
    details.append(summaryLine, scoreTable(tokens));
    card.root.querySelector(".card-foot").append(details);
    setCardState(card, "done");
  } catch (error) {
    if (isAbort(error)) setCardState(card, "stopped");
    else showCardError(card, error);
  } finally {
    state.controllers.delete(controller);
  }
}

const RUNNERS = {generate: runGenerate, compare: runCompare, score: runScore};

async function run(state) {
  if (state.controllers.size > 0 || !$("model").value) return;
  hideTip();
  $("error").hidden = true;
  $("outputs").replaceChildren();
  $("outputs").classList.remove("side-by-side");
  setBusy(true);
  try {
    await RUNNERS[state.mode](state);
  } catch (error) {
    showPageError(error instanceof InputError ? error.message : `the page failed: ${error}`);
  } finally {
    setBusy(false);
  }
}

function stop(state) {
  for (const controller of state.controllers) controller.abort();
}

function setBusy(busy) {
  document.body.dataset.busy = busy ? "1" : "";
  $("run").disabled = busy;
  $("stop-run").disabled = !busy;
}

function showPageError(message, status = null) {
  const box = $("error");
  box.replaceChildren();
  if (status !== null) {
    const b = document.createElement("b");
    b.textContent = String(status);
    box.append(b, " ");
  }
  box.append(message);
  box.hidden = false;
}

function runOnCtrlEnter(event) {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    $("run").click();
  }
}

// ---- mode, model, key ---------------------------------------------------------------------------

function setMode(state, mode) {
  state.mode = mode;
  for (const tab of document.querySelectorAll(".modes [data-mode]")) {
    tab.setAttribute("aria-selected", String(tab.dataset.mode === mode));
  }
  const shown = SCOPES_SHOWN[mode];
  for (const element of document.querySelectorAll("#settings [data-scope]")) {
    element.hidden = !element.dataset.scope.split(" ").some((scope) => shown.includes(scope));
  }
  $("settings").querySelector("summary").textContent = mode === "generate" ? "Decoding" : "Settings";
  $("panes-box").hidden = mode !== "compare";
  $("run").textContent = RUN_LABELS[mode];
  updateConstraintBox(state);
  updateInputKind(state);
}

/** Chat messages or a prompt: chat only for a model with a chat template, and never when scoring. */
function updateInputKind(state) {
  const model = currentModel(state);
  const canChat = Boolean(model && model.chat) && state.mode !== "score";
  $("kind-switch").hidden = !canChat;
  const chat = currentRoute(state) === "chat";
  $("chat-box").hidden = !chat;
  $("prompt-box").hidden = chat;
  $("prompt-label").textContent = state.mode === "score" ? "Text to score" : "Prompt";
  showSeq2Seq(model, state.mode);
}

async function loadModels(state) {
  $("error").hidden = true;
  try {
    const answer = await getJson("v1/models", state.apiKey);
    state.models = answer.data;
  } catch (error) {
    state.models = [];
    const hint = error.status === 401 ? " (enter the server's key under API key)" : "";
    showPageError(`${error.message}${hint}`, error instanceof ApiError ? error.status : null);
    if (error.status === 401) $("key-box").open = true;
    // The server is up but its models are still loading: ask again when it says to.
    if (error.status === 503 && error.retryAfter !== null) {
      setTimeout(() => loadModels(state), error.retryAfter * 1000);
    }
  }
  const select = $("model");
  const previous = select.value;
  select.replaceChildren(...state.models.map((m) => new Option(modelLabel(m), m.id)));
  if (state.models.some((m) => m.id === previous)) select.value = previous;
  $("run").disabled = state.models.length === 0;
  updateInputKind(state);
}

function showKeyState(state) {
  const label = $("key-state");
  label.textContent = state.apiKey ? "set" : "none";
  label.dataset.set = state.apiKey ? "1" : "";
}

function useKey(state, key) {
  state.apiKey = key;
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
  $("api-key").value = "";
  showKeyState(state);
  loadModels(state);
}

// ---- server gauges ------------------------------------------------------------------------------

function gauge(metrics, name, model) {
  const quoted = model.replace(/\\/g, "\\\\").replace(/"/g, '\\"');
  for (const line of metrics.split("\n")) {
    if (line.startsWith(`${name}{`) && line.includes(`model="${quoted}"`)) return Number(line.split(" ").pop());
  }
  return null;
}

/** Running and waiting requests and cache use of the chosen model, from /metrics (open without a key). */
async function pollMetrics(state) {
  const model = $("model").value;
  if (!document.hidden && model) {
    try {
      const metrics = await getText("metrics");
      const running = gauge(metrics, "quill_num_requests_running", model);
      const waiting = gauge(metrics, "quill_num_requests_waiting", model);
      const cache = gauge(metrics, "quill_cache_usage_ratio", model);
      const parts = [running === null ? null : `${running} running`, waiting === null ? null : `${waiting} waiting`,
        cache === null ? null : `cache ${(100 * cache).toFixed(1)}% used`].filter((part) => part !== null);
      $("server-state").textContent = parts.length > 0 ? `${model}: ${parts.join(" · ")}` : "";
    } catch {
      $("server-state").textContent = "";  // metrics are a nicety; the page works without them
    }
  }
  setTimeout(() => pollMetrics(state), METRICS_EVERY_MS);
}

// ---- wiring ---------------------------------------------------------------------------------------

function main() {
  const state = newState();
  for (const tab of document.querySelectorAll(".modes [data-mode]")) {
    tab.addEventListener("click", () => setMode(state, tab.dataset.mode));
  }
  for (const button of document.querySelectorAll("[data-preset]")) {
    button.addEventListener("click", () => applyPreset(button.dataset.preset));
  }
  for (const radio of document.querySelectorAll("input[name=kind]")) {
    radio.addEventListener("change", () => updateInputKind(state));
  }
  $("model").addEventListener("change", () => updateInputKind(state));
  $("constraint_kind").addEventListener("change", () => updateConstraintBox(state));
  $("run").addEventListener("click", () => run(state));
  $("stop-run").addEventListener("click", () => stop(state));
  $("prompt").addEventListener("keydown", runOnCtrlEnter);
  $("add-message").addEventListener("click", () => addMessage("user", "").querySelector("textarea").focus());
  $("add-pane").addEventListener("click", () => addPaneSetting("greedy"));
  $("key-use").addEventListener("click", () => useKey(state, $("api-key").value.trim()));
  $("api-key").addEventListener("keydown", (event) => {
    if (event.key === "Enter") useKey(state, $("api-key").value.trim());
  });
  $("key-forget").addEventListener("click", () => useKey(state, ""));
  addMessage("system", "You are a helpful assistant.");
  addMessage("user", "Write one line about the sea.");
  for (const name of DEFAULT_PANES) addPaneSetting(name);
  installTips(state, $("outputs"));
  if (window.matchMedia(NARROW).matches) $("settings").open = false;  // on a phone the prompt and Run come first
  showKeyState(state);
  setMode(state, "generate");
  setBusy(false);
  loadModels(state);
  pollMetrics(state);
}

main();

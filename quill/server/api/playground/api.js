// Talking to Quill's HTTP API from the page: JSON requests carrying the bearer key, Server-Sent Events
// read from a fetch body (EventSource cannot send an Authorization header, and a fetch can be aborted),
// and the chunks of /v1/completions and /v1/chat/completions turned into one shape the page draws.
// No DOM here.

/** An answer the server refused: its HTTP status, the message it wrote, untouched, and the seconds its
 * Retry-After asks to wait before trying again (null when it gave none). */
export class ApiError extends Error {
  constructor(status, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

function headers(apiKey, extra = {}) {
  const h = {"Content-Type": "application/json", ...extra};
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

/** The message in an error body of either dialect: {"error": {"message": ...}} or {"error": "..."}. */
export function serverMessage(body) {
  const error = body && body.error;
  if (typeof error === "string") return error;
  if (error && typeof error.message === "string") return error.message;
  return null;
}

async function failure(response) {
  const text = await response.text();
  let message = null;
  try {
    message = serverMessage(JSON.parse(text));
  } catch {
    // not JSON (a proxy's page, say): show what came
  }
  const retryAfter = Number.parseFloat(response.headers.get("Retry-After"));
  return new ApiError(response.status, message ?? (text || response.statusText),
                      Number.isFinite(retryAfter) ? retryAfter : null);
}

export async function getJson(path, apiKey, signal) {
  const response = await fetch(path, {headers: headers(apiKey), signal});
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function postJson(path, body, apiKey, signal) {
  const response = await fetch(path, {method: "POST", headers: headers(apiKey), body: JSON.stringify(body), signal});
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function getText(path, signal) {
  const response = await fetch(path, {signal});
  if (!response.ok) throw await failure(response);
  return response.text();
}

/** The data of one SSE event (its "data:" lines joined), or null when it has none. */
function eventData(event) {
  const lines = event.split("\n").filter((line) => line.startsWith("data:"));
  if (lines.length === 0) return null;
  return lines.map((line) => line.slice(line.startsWith("data: ") ? 6 : 5)).join("\n");
}

/**
 * POST a request with "stream": true and yield each event's JSON until [DONE]. An error event in the
 * middle of the stream is thrown as an ApiError with the server's message. Aborting `signal` ends the
 * fetch, and with it the connection: the server then aborts the request and frees its cache.
 */
export async function* postStream(path, body, apiKey, signal) {
  const response = await fetch(path, {
    method: "POST", headers: headers(apiKey, {Accept: "text/event-stream"}), body: JSON.stringify(body), signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) throw new ApiError(response.status, "the stream ended before its [DONE] event");
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const data = eventData(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (data === null) continue;
        if (data === "[DONE]") return;
        const payload = JSON.parse(data);
        const message = serverMessage(payload);
        if (message !== null) throw new ApiError(response.status, message);
        yield payload;
      }
    }
  } finally {
    reader.cancel().catch(() => {});  // a consumer that stops early closes the connection too
  }
}

// ---- one shape for both routes --------------------------------------------------------------------
// A piece: {index, text, tokens, finish}. `text` is what the server says this chunk adds to choice
// `index`; `tokens` (null without log-probabilities) are the tokens behind it, each
// {text, logprob, top: [[text, logprob], ...]} with `top` most likely first.

function byLikelihood(pairs) {
  return pairs.filter(([, lp]) => lp !== null && lp !== undefined).sort((a, b) => b[1] - a[1]);
}

/** Tokens of an OpenAI completions logprobs block: parallel lists, alternatives as {text: logprob}. */
export function completionTokens(logprobs) {
  if (!logprobs || !Array.isArray(logprobs.tokens)) return null;
  return logprobs.tokens.map((text, i) => ({
    text,
    logprob: logprobs.token_logprobs[i],
    top: byLikelihood(Object.entries((logprobs.top_logprobs || [])[i] || {})),
  }));
}

/** Tokens of a chat logprobs block: choices[].logprobs.content[] of {token, logprob, top_logprobs[]}. */
export function chatTokens(logprobs) {
  if (!logprobs || !Array.isArray(logprobs.content)) return null;
  return logprobs.content.map((entry) => ({
    text: entry.token,
    logprob: entry.logprob,
    top: byLikelihood((entry.top_logprobs || []).map((alt) => [alt.token, alt.logprob])),
  }));
}

export function completionPieces(payload) {
  return (payload.choices || []).map((choice) => ({
    index: choice.index, text: choice.text || "", finish: choice.finish_reason || null,
    tokens: completionTokens(choice.logprobs),
  }));
}

export function chatPieces(payload) {
  return (payload.choices || []).map((choice) => ({
    index: choice.index, text: (choice.delta && choice.delta.content) || "", finish: choice.finish_reason || null,
    tokens: chatTokens(choice.logprobs),
  }));
}

/**
 * The two generation routes. `body(model, input, settings, alternatives)` builds a streamed request:
 * `input` is a prompt string (completion) or a list of {role, content} (chat); `alternatives` is how
 * many top tokens to ask for per position (null: no log-probabilities).
 */
export const ROUTES = {
  completion: {
    path: "v1/completions",
    pieces: completionPieces,
    body(model, prompt, settings, alternatives) {
      const body = {model, prompt, ...settings, stream: true, stream_options: {include_usage: true}};
      if (alternatives !== null) body.logprobs = alternatives;
      return body;
    },
  },
  chat: {
    path: "v1/chat/completions",
    pieces: chatPieces,
    body(model, messages, settings, alternatives) {
      // The page's beam width is completions' best_of; chat has no best_of (the server refuses it): its
      // beam width is n, and every beam is answered. Nor does it give log-probabilities with beam search.
      const {best_of: beams, ...rest} = settings;
      const body = {model, messages, ...rest, stream: true, stream_options: {include_usage: true}};
      if (beams !== undefined) body.n = beams;
      if (alternatives !== null && !body.use_beam_search) {
        body.logprobs = true;
        body.top_logprobs = alternatives;
      }
      return body;
    },
  },
};

/**
 * Scoring a text: its tokens and their log-probabilities, from echo + logprobs. The server generates at
 * least one token (max_tokens >= 1); that token is dropped, keeping the prompt's usage.prompt_tokens.
 */
export function scoreBody(model, text, alternatives) {
  return {model, prompt: text, max_tokens: 1, temperature: 0, echo: true, logprobs: alternatives};
}

export function scoredTokens(answer) {
  const tokens = completionTokens(answer.choices[0].logprobs) || [];
  return tokens.slice(0, answer.usage.prompt_tokens);
}

/**
 * Per-token summary of a scored text. The first token has no log-probability (nothing comes before
 * it), so it is counted out: perplexity = exp(-mean log p) over the tokens that have one.
 */
export function perplexity(tokens) {
  const logprobs = tokens.map((t) => t.logprob).filter((lp) => lp !== null && lp !== undefined);
  if (logprobs.length === 0) return {scored: 0, total: null, mean: null, perplexity: null};
  const total = logprobs.reduce((a, b) => a + b, 0);
  const mean = total / logprobs.length;
  return {scored: logprobs.length, total, mean, perplexity: Math.exp(-mean)};
}

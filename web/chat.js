// chat.js — the chat page of `muser serve` (docs/serve.md, "The chat page"). Plain JavaScript, no
// framework, nothing fetched but this server's own API:
//   GET  /v1/models            the model's name, context, backend and slots for the header;
//   POST /v1/chat/completions  the reply, streamed (server-sent events) with logprobs: each token
//                              is shown shaded by its probability, its alternatives on hover/tap.
// Stop aborts the fetch; the server sees the connection close, cancels the sequence and frees its
// slot. A 401 asks for the API key once and keeps it in sessionStorage (this tab only); every
// other error shows the server's own message.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "muser.apiKey";

const state = {
  key: sessionStorage.getItem(KEY_STORE) || "",
  model: null, // the /v1/models entry
  history: [], // {role, content} of the conversation's finished turns
  conversation: 0, // counts new chats: a reply that ends after one is not part of the new one
  busy: null, // the AbortController of the reply in flight
};

class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code || null;
  }
  toString() {
    return (this.status ? `HTTP ${this.status}: ` : "") + this.message;
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The server's OpenAI-style error body, as an ApiError.
async function errorOf(res) {
  let message = `${res.status} ${res.statusText}`.trim(), code = null;
  try {
    const j = await res.json();
    if (j && j.error && j.error.message) ({ message, code } = j.error);
  } catch (_) { /* not JSON: the status line stands */ }
  return new ApiError(res.status, message, code);
}

// fetch with the key; a 401 asks for a key and tries again (until the user cancels).
async function api(path, init = {}) {
  for (;;) {
    const headers = new Headers(init.headers || {});
    if (state.key) headers.set("Authorization", `Bearer ${state.key}`);
    const res = await fetch(path, { ...init, headers });
    if (res.status !== 401) return res;
    const err = await errorOf(res);
    const key = await askKey(state.key ? `The server refused the key: ${err.message}` : `The server wants an API key: ${err.message}`, !!state.key);
    if (key === null) throw err;
  }
}

// ---- the API key dialog ----

let keyWait = null;
function askKey(reason, refused) {
  if (keyWait) return keyWait;
  const d = $("key-dialog"), input = $("key");
  $("key-reason").textContent = reason;
  $("key-reason").classList.toggle("error", refused);
  input.value = "";
  keyWait = new Promise((resolve) => {
    const done = (key) => {
      $("key-form").onsubmit = $("key-cancel").onclick = d.oncancel = null;
      if (d.open) d.close();
      keyWait = null;
      resolve(key);
    };
    $("key-form").onsubmit = (e) => {
      e.preventDefault();
      const k = input.value.trim();
      if (!k) return;
      state.key = k;
      sessionStorage.setItem(KEY_STORE, k);
      $("key-change").hidden = false;
      done(k);
    };
    $("key-cancel").onclick = () => done(null);
    d.oncancel = (e) => {
      e.preventDefault();
      done(null);
    };
  });
  d.showModal();
  input.focus();
  return keyWait;
}

// ---- the model ----

async function loadModel() {
  const name = $("model-name");
  for (;;) {
    let res;
    try {
      res = await api("/v1/models");
    } catch (e) {
      if (e instanceof ApiError) { // no key given
        name.textContent = "an API key is needed";
        $("key-change").hidden = false;
        return;
      }
      name.textContent = "cannot reach the server; retrying…";
      await sleep(2000);
      continue;
    }
    if (res.status === 503) {
      name.textContent = "the model is loading…";
      await sleep(1000);
      continue;
    }
    if (!res.ok) {
      name.textContent = `models: ${await errorOf(res)}`;
      return;
    }
    const m = (await res.json()).data[0];
    state.model = m;
    name.textContent = m.id;
    $("model-ctx").textContent = `${m.context_length} tokens of context`;
    $("model-backend").textContent = m.backend;
    $("model-slots").textContent = `${m.slots} slot${m.slots === 1 ? "" : "s"}`;
    $("max_tokens").max = m.context_length;
    if (state.key) $("key-change").hidden = false;
    return;
  }
}

// ---- settings ----

// The request's sampling fields from the form; a blank field is left to the server's default
// (a blank seed: a fresh one per reply). Ranges are the server's to check: its message shows.
function settings() {
  const num = (id) => {
    const el = $(id);
    if (el.validity.badInput) throw new ApiError(0, `${el.labels[0].textContent}: not a number`);
    return el.value.trim() === "" ? undefined : Number(el.value);
  };
  return {
    system: $("system").value,
    temperature: num("temperature"),
    top_p: num("top_p"),
    max_tokens: num("max_tokens"),
    seed: num("seed"),
    top_logprobs: num("top_logprobs"),
  };
}

// ---- the conversation view ----

const log = $("log");
const tokData = new WeakMap(); // token span -> its logprobs entry

function nearBottom() {
  return log.scrollHeight - log.scrollTop - log.clientHeight < 48;
}

function append(el) {
  const stick = nearBottom();
  $("empty").hidden = true;
  log.append(el);
  if (stick) log.scrollTop = log.scrollHeight;
  return el;
}

function element(tag, cls, text) {
  const el = document.createElement(tag);
  if (cls) el.className = cls;
  if (text !== undefined) el.textContent = text;
  return el;
}

function addUser(text) {
  const m = element("article", "msg user");
  m.append(element("div", "body", text));
  return append(m);
}

function addError(err) {
  const el = element("div", "msg error", String(err));
  el.setAttribute("role", "alert");
  return append(el);
}

function formatMs(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

// One reply: its token spans, its stats line.
class ReplyView {
  constructor() {
    this.el = element("article", "msg assistant");
    this.body = element("div", "body");
    this.stats = element("div", "stats");
    this.el.append(this.body, this.stats);
    this.decoder = new TextDecoder(); // streaming: a character split over tokens shows once whole
    this.n = 0;
    append(this.el);
  }

  addToken(t) {
    const stick = nearBottom();
    const bytes = Array.isArray(t.bytes) ? new Uint8Array(t.bytes) : new TextEncoder().encode(t.token);
    const s = element("span", "tok", this.decoder.decode(bytes, { stream: true }));
    s.style.setProperty("--p", Math.exp(t.logprob).toFixed(4));
    s.dataset.logprob = String(t.logprob);
    tokData.set(s, t);
    this.body.append(s);
    this.n++;
    if (stick) log.scrollTop = log.scrollHeight;
  }

  addText(text) { // content that came without logprobs
    this.body.append(document.createTextNode(text));
  }

  end() { // the bytes of a character the reply did not finish
    const rest = this.decoder.decode();
    if (rest) this.addText(rest);
  }

  // ttft and the rate in ms / tok/s (null: not known yet); finish: stop, length, stopped, error
  showStats({ ttft, tps, n, finish }) {
    const parts = [];
    this.stats.replaceChildren();
    const part = (cls, text, value) => {
      const s = element("span", cls, text);
      if (value !== undefined) s.dataset.value = String(value);
      parts.push(s);
    };
    if (ttft !== null) part("ttft", `TTFT ${formatMs(ttft)}`, ttft);
    if (tps !== null) part("tps", `${tps.toFixed(1)} tok/s`, tps);
    part("ntok", `${n} token${n === 1 ? "" : "s"}`, n);
    if (finish) part("finish", finish === "stopped" ? "stopped" : finish === "length" ? "max tokens" : finish === "stop" ? "end of reply" : finish, finish);
    parts.forEach((p, i) => {
      if (i) this.stats.append(" · ");
      this.stats.append(p);
    });
  }
}

// ---- streaming ----

// Calls onEvent with each server-sent event's data (a string) until the stream ends.
async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const data = buf.slice(0, i).split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      buf = buf.slice(i + 2);
      if (data && onEvent(data) === false) return;
    }
  }
}

function setBusy(ctl) {
  state.busy = ctl;
  $("send").hidden = !!ctl;
  $("stop").hidden = !ctl;
}

async function send(text) {
  let s;
  try {
    s = settings();
  } catch (e) {
    addError(e);
    input.value = input.value || text;
    return;
  }
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  messages.push(...state.history, { role: "user", content: text });
  const body = {
    model: state.model ? state.model.id : "",
    messages,
    stream: true,
    stream_options: { include_usage: true },
    logprobs: true,
  };
  for (const k of ["temperature", "top_p", "max_tokens", "seed", "top_logprobs"]) if (s[k] !== undefined) body[k] = s[k];

  const conversation = state.conversation;
  const user = addUser(text);
  const view = new ReplyView();
  const ctl = new AbortController();
  setBusy(ctl);
  const t0 = performance.now();
  const r = { text: "", first: 0, last: 0, finish: null, usage: null };
  const stats = () => ({
    ttft: r.first ? r.first - t0 : null,
    tps: view.n > 1 && r.last > r.first ? (view.n - 1) / ((r.last - r.first) / 1000) : null,
    n: r.usage ? r.usage.completion_tokens : view.n,
    finish: r.finish,
  });
  let error = null;
  try {
    const res = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: ctl.signal,
    });
    if (!res.ok) throw await errorOf(res);
    await readEvents(res, (data) => {
      if (data === "[DONE]") return false;
      const j = JSON.parse(data);
      if (j.error) throw new ApiError(0, `the server stopped the reply: ${j.error.message}`, j.error.code);
      if (j.usage) r.usage = j.usage;
      const c = j.choices && j.choices[0];
      if (!c) return true;
      const toks = (c.logprobs && c.logprobs.content) || [];
      const content = c.delta && typeof c.delta.content === "string" ? c.delta.content : "";
      if (toks.length || content) {
        const now = performance.now();
        if (!r.first) r.first = now;
        r.last = now;
      }
      r.text += content;
      if (toks.length) toks.forEach((t) => view.addToken(t));
      else if (content) view.addText(content);
      if (c.finish_reason) r.finish = c.finish_reason;
      view.showStats(stats());
      return true;
    });
    if (!r.finish) throw new ApiError(0, "the stream ended before the reply did (did the server stop?)");
  } catch (e) {
    if (ctl.signal.aborted) r.finish = r.finish || "stopped";
    else if (e instanceof ApiError) error = e;
    else error = new ApiError(0, e instanceof TypeError ? `cannot reach the server: ${e.message}` : `a bad reply from the server: ${e.message}`);
  } finally {
    setBusy(null);
  }
  view.end();
  if (conversation !== state.conversation) return; // a new chat began meanwhile
  if (error) {
    r.finish = r.finish || "error";
    addError(error);
  }
  if (view.n || r.text) {
    view.showStats(stats());
    state.history.push({ role: "user", content: text }, { role: "assistant", content: r.text });
  } else {
    view.el.remove();
    user.classList.add("failed");
    if (!input.value) input.value = text; // to send again
  }
}

// ---- the token tip: hover (mouse) or tap ----

const tip = $("tip");
let tipFor = null, pinned = false;

function shown(text) {
  if (text === "") return "∅";
  return text.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥");
}

function tokenLabel(t) {
  const bytes = Array.isArray(t.bytes) ? new Uint8Array(t.bytes) : null;
  const text = bytes ? new TextDecoder().decode(bytes) : t.token;
  if (bytes && text.includes("\uFFFD")) return Array.from(bytes, (b) => `\\x${b.toString(16).padStart(2, "0")}`).join("");
  return shown(text);
}

const fmtLp = (lp) => lp.toFixed(3).replace("-", "−");
function fmtP(p) {
  return p >= 0.001 ? `${(p * 100).toFixed(1)}%` : "<0.1%";
}

function showTip(span) {
  const t = tokData.get(span);
  if (!t) return;
  if (tipFor) tipFor.classList.remove("active");
  tipFor = span;
  span.classList.add("active");
  tip.replaceChildren();
  const head = element("div", "head");
  head.append(element("code", "t", tokenLabel(t)), ` p ${fmtP(Math.exp(t.logprob))} · logprob ${fmtLp(t.logprob)}`);
  tip.append(head);
  const alts = t.top_logprobs || [];
  if (alts.length) {
    const table = element("table", "alts");
    for (const a of alts) {
      const tr = element("tr", a.token === t.token ? "alt chosen" : "alt");
      tr.dataset.logprob = String(a.logprob);
      const bar = element("span", "pbar");
      bar.style.width = `${Math.max(0, Math.min(1, Math.exp(a.logprob))) * 100}%`;
      const cells = [element("td", "tok-cell"), element("td", "num lp", fmtLp(a.logprob)), element("td", "num", fmtP(Math.exp(a.logprob))), element("td", "bar-cell")];
      cells[0].append(element("code", "t", tokenLabel(a)));
      cells[3].append(bar);
      tr.append(...cells);
      table.append(tr);
    }
    tip.append(table);
  } else {
    tip.append(element("div", "hint", "No alternatives were asked for (Settings: Alternatives)."));
  }
  tip.hidden = false;
  placeTip();
}

function placeTip() {
  if (!tipFor) return;
  const r = tipFor.getBoundingClientRect(), w = tip.offsetWidth, h = tip.offsetHeight;
  const x = Math.max(4, Math.min(r.left, window.innerWidth - w - 4));
  const below = r.bottom + 6, above = r.top - h - 6;
  tip.style.left = `${x}px`;
  tip.style.top = `${below + h <= window.innerHeight || above < 0 ? below : above}px`;
}

function hideTip() {
  if (tipFor) tipFor.classList.remove("active");
  tip.hidden = true;
  tipFor = null;
  pinned = false;
}

log.addEventListener("pointerover", (e) => {
  if (e.pointerType !== "mouse" || pinned) return;
  const s = e.target.closest(".tok");
  if (s) showTip(s);
});
log.addEventListener("pointerout", (e) => {
  if (e.pointerType !== "mouse" || pinned) return;
  const s = e.target.closest(".tok");
  if (s && !(e.relatedTarget && s.contains(e.relatedTarget))) hideTip();
});
log.addEventListener("click", (e) => {
  const s = e.target.closest(".tok");
  if (!s) return hideTip();
  if (pinned && tipFor === s) return hideTip();
  showTip(s);
  pinned = true;
});
document.addEventListener("click", (e) => {
  if (!log.contains(e.target) && !tip.contains(e.target)) hideTip();
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") hideTip();
});
log.addEventListener("scroll", placeTip);
window.addEventListener("resize", placeTip);

// ---- the controls ----

const input = $("input");
function grow() {
  input.style.height = "auto";
  input.style.height = `${input.scrollHeight + 2}px`;
}
input.addEventListener("input", grow);
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = input.value;
  if (state.busy || !text.trim()) return;
  input.value = "";
  grow();
  send(text);
});
$("stop").addEventListener("click", () => {
  if (state.busy) state.busy.abort();
});
$("new-chat").addEventListener("click", () => {
  if (state.busy) state.busy.abort();
  state.history = [];
  state.conversation++;
  hideTip();
  log.querySelectorAll(".msg").forEach((m) => m.remove());
  $("empty").hidden = false;
  input.focus();
});
$("shade").addEventListener("change", (e) => log.classList.toggle("shade", e.target.checked));
log.classList.toggle("shade", $("shade").checked);

function openSettings(open) {
  $("settings").classList.toggle("open", open);
  $("settings-toggle").setAttribute("aria-expanded", String(open));
}
$("settings-toggle").addEventListener("click", () => openSettings(!$("settings").classList.contains("open")));
openSettings(window.matchMedia("(min-width: 900px)").matches);

$("key-change").addEventListener("click", async () => {
  if (await askKey("Enter the API key for this server.", false) !== null) loadModel();
});

loadModel();

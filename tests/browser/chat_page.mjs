// chat_page.mjs — the chat page of `muser serve` in headless Chromium (playwright-core), run by
// tests/cli_serve_browser.sh against two servers on loopback:
//   A: the default model, no key;  B: the same model with --api-key KEY, --slots 1 --queue 0.
// Each check compares what the page shows with what the server says for the same request, so a
// page that sends the wrong settings, drops tokens, mis-shades them, shows the wrong
// alternatives, does not cancel on stop, or loses the key fails here.
// usage: node chat_page.mjs PORT_A PORT_B KEY OUT_DIR   (screenshots go to OUT_DIR)
import { chromium } from "playwright-core";
import { join } from "node:path";

const [portA, portB, KEY, OUT] = process.argv.slice(2);
if (!OUT) {
  console.error("usage: node chat_page.mjs PORT_A PORT_B KEY OUT_DIR");
  process.exit(2);
}
const A = `http://127.0.0.1:${portA}`, B = `http://127.0.0.1:${portB}`;
const AUTH = { Authorization: `Bearer ${KEY}` };
const WAIT = 90_000; // generous: the server may run under ASan on a busy machine

class Fail extends Error {}
function check(cond, msg) {
  if (!cond) throw new Fail(msg);
}
const ok = (msg) => console.log(`ok: ${msg}`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- the server, directly ----

async function chat(base, body, headers = {}) {
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json", ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: await res.json() };
}

async function metric(base, name, headers = {}) {
  const text = await (await fetch(`${base}/metrics`, { headers })).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  check(line, `/metrics has no ${name}`);
  return Number(line.slice(name.length + 1));
}
const CANCELLED = 'muser_requests_total{outcome="cancelled"}';

async function until(what, fn, ms = 15_000) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    check(Date.now() < end, `timed out waiting for ${what}`);
    await sleep(50);
  }
}

// ---- the page ----

// Errors in the page fail the test: a script error, a CSP refusal. A failed load is expected
// only for the statuses the test provokes (401, 400, 429).
function watch(page) {
  const errors = [];
  page.on("pageerror", (e) => errors.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    if (/Failed to load resource: the server responded with a status of (400|401|429)/.test(m.text())) return;
    errors.push(`console: ${m.text()}`);
  });
  return errors;
}

// Clicks the button with that id from inside the page as the newest reply shows its n-th token
// (at once, unlike a click from outside that a fast reply would outrun).
function clickAtToken(page, id, n) {
  return page.evaluate(([id, n]) => {
    const log = document.getElementById("log");
    const obs = new MutationObserver(() => {
      const m = [...log.querySelectorAll(".msg.assistant")].pop();
      if (m && m.querySelectorAll(".tok").length >= n) {
        obs.disconnect();
        document.getElementById(id).click();
      }
    });
    obs.observe(log, { childList: true, subtree: true });
  }, [id, n]);
}

async function settings(page, s) {
  for (const [id, v] of Object.entries(s)) await page.fill(`#${id}`, String(v));
}

async function say(page, text) {
  const before = await page.locator(".msg.assistant .stats .finish, .msg.error").count();
  await page.fill("#input", text);
  await page.press("#input", "Enter");
  await page.waitForFunction((n) => document.querySelectorAll(".msg.assistant .stats .finish, .msg.error").length > n, before, { timeout: WAIT });
}

// The last reply as the page shows it.
function lastReply(page) {
  return page.evaluate(() => {
    const m = [...document.querySelectorAll(".msg.assistant")].pop();
    if (!m) return null;
    const val = (cls) => {
      const s = m.querySelector(`.stats .${cls}`);
      return s ? { text: s.textContent, value: s.dataset.value } : null;
    };
    return {
      text: m.querySelector(".body").textContent,
      toks: [...m.querySelectorAll(".tok")].map((s) => ({
        text: s.textContent,
        logprob: Number(s.dataset.logprob),
        p: Number(getComputedStyle(s).getPropertyValue("--p")),
        bg: getComputedStyle(s).backgroundColor,
      })),
      stats: m.querySelector(".stats").textContent,
      ttft: val("ttft"),
      tps: val("tps"),
      ntok: val("ntok"),
      finish: val("finish"),
    };
  });
}

const rgb = (css) => (css.match(/[\d.]+/g) || []).map(Number);
const transparent = (css) => css === "transparent" || (rgb(css).length === 4 && rgb(css)[3] === 0);
const label = (t) => (t === "" ? "∅" : t.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥"));
const fmtLp = (lp) => lp.toFixed(3).replace("-", "−");

// A reply's tokens and logprobs against the server's for the same request.
function sameReply(got, want, what) {
  const c = want.choices[0];
  check(got.text === c.message.content, `${what}: the page shows ${JSON.stringify(got.text)}, the server says ${JSON.stringify(c.message.content)}`);
  const lp = c.logprobs.content;
  check(got.toks.length === lp.length && lp.length > 0, `${what}: ${got.toks.length} token spans, the server generated ${lp.length}`);
  lp.forEach((t, i) => {
    check(got.toks[i].logprob === t.logprob, `${what}: token ${i} logprob ${got.toks[i].logprob}, the server's ${t.logprob}`);
    check(Math.abs(got.toks[i].p - Math.exp(t.logprob)) < 1e-3, `${what}: token ${i} is shaded for p ${got.toks[i].p}, its p is ${Math.exp(t.logprob)}`);
  });
}

// ---- 1. the files, over HTTP ----

async function files() {
  const page = await fetch(`${A}/`);
  check(page.status === 200, `GET / is ${page.status}`);
  check(/^text\/html/.test(page.headers.get("content-type")), `GET / is ${page.headers.get("content-type")}`);
  const csp = page.headers.get("content-security-policy") || "";
  check(/default-src 'none'/.test(csp) && /script-src 'self'/.test(csp) && /connect-src 'self'/.test(csp), `CSP: '${csp}'`);
  check((await page.text()).includes('<script src="chat.js"'), "GET / is not the page");
  for (const [path, type] of [["/chat.js", /^text\/javascript/], ["/chat.css", /^text\/css/]]) {
    const r = await fetch(A + path);
    check(r.status === 200 && type.test(r.headers.get("content-type")), `GET ${path}: ${r.status} ${r.headers.get("content-type")}`);
  }
  const keyed = await fetch(`${B}/`);
  check(keyed.status === 200, `GET / with --api-key and no key: ${keyed.status} (the page needs no key)`);
  check((await fetch(`${B}/v1/models`)).status === 401, "the keyed server's /v1/models answers without a key");
  ok("GET / (text/html, CSP), /chat.js, /chat.css; / needs no key where the API does");
}

// ---- 2. a conversation on a desktop ----

async function desktop(browser) {
  const ctx = await browser.newContext({ viewport: { width: 1100, height: 760 } });
  const page = await ctx.newPage();
  const errors = watch(page);
  await page.goto(`${A}/`);
  const model = (await (await fetch(`${A}/v1/models`)).json()).data[0];
  await page.waitForFunction((id) => document.getElementById("model-name").textContent === id, model.id, { timeout: WAIT });
  const ctxText = await page.textContent("#model-ctx"), backend = await page.textContent("#model-backend");
  check(ctxText.includes(String(model.context_length)), `the header shows '${ctxText}', the context is ${model.context_length}`);
  check(backend === model.backend, `the header shows backend '${backend}', the server's is ${model.backend}`);
  check(await page.isVisible("#settings"), "the settings are not shown on a wide screen");
  ok(`header: ${model.id}, ${model.context_length} tokens of context, ${model.backend}`);

  // the first turn, with every setting changed
  const system = "Answer in the words of the Bible.";
  const s = { temperature: 0.7, top_p: 0.9, max_tokens: 40, seed: 1, top_logprobs: 4 };
  await settings(page, { system, ...s });
  const q1 = "What is a hacker?";
  await say(page, q1);
  const r1 = await lastReply(page);
  const msgs1 = [{ role: "system", content: system }, { role: "user", content: q1 }];
  const w1 = await chat(A, { messages: msgs1, ...s, logprobs: true });
  check(w1.status === 200, `the direct request: ${JSON.stringify(w1.json)}`);
  sameReply(r1, w1.json, "turn 1");
  ok(`turn 1: ${r1.toks.length} tokens, text and logprobs equal the server's for the same settings (system prompt, temperature, top-p, seed)`);

  // stats (max tokens is checked by the error below: sent, it makes the context too long)
  check(r1.ttft && /^TTFT \d+(\.\d+)? (ms|s)$/.test(r1.ttft.text) && Number(r1.ttft.value) > 0, `TTFT: ${JSON.stringify(r1.ttft)} in '${r1.stats}'`);
  check(r1.tps && /^\d+\.\d tok\/s$/.test(r1.tps.text) && Number(r1.tps.value) > 0, `tok/s: ${JSON.stringify(r1.tps)} in '${r1.stats}'`);
  check(Number(r1.ntok.value) === w1.json.usage.completion_tokens, `the stats count ${r1.ntok.value} tokens, usage says ${w1.json.usage.completion_tokens}`);
  check(r1.finish.value === w1.json.choices[0].finish_reason, `finish ${r1.finish.value}, the server's ${w1.json.choices[0].finish_reason}`);
  ok(`stats: '${r1.stats}'`);

  // shading: every token shaded, the colour a function of p running red -> green
  check(r1.toks.every((t) => !transparent(t.bg)), `a token is not shaded: ${JSON.stringify(r1.toks.map((t) => t.bg))}`);
  const byP = [...r1.toks].sort((a, b) => a.p - b.p);
  const seen = byP.filter((t) => t.text.trim()); // a span of white space alone has no box to point at
  const greenness = (t) => rgb(t.bg)[1] - rgb(t.bg)[0];
  for (let i = 1; i < byP.length; i++)
    if (byP[i].p - byP[i - 1].p > 0.02)
      check(greenness(byP[i]) > greenness(byP[i - 1]), `p ${byP[i].p} is shaded ${byP[i].bg}, p ${byP[i - 1].p} ${byP[i - 1].bg}: not redder for less likely`);
  check(byP[byP.length - 1].p - byP[0].p > 0.1, `the reply's probabilities are all alike (${byP[0].p}..${byP[byP.length - 1].p}): pick another seed`);
  await page.uncheck("#shade");
  check((await lastReply(page)).toks.every((t) => transparent(t.bg)), "unchecking the shading leaves tokens shaded");
  await page.check("#shade");
  ok(`shading: ${new Set(r1.toks.map((t) => t.bg)).size} shades over p ${byP[0].p.toFixed(3)}..${byP[byP.length - 1].p.toFixed(3)}, red to green; the switch turns it off`);

  // hover: the least likely token's alternatives, as the server gave them
  const k = r1.toks.indexOf(seen[0]);
  const wantTok = w1.json.choices[0].logprobs.content[k];
  const last = page.locator(".msg.assistant").last();
  await last.locator(".tok").nth(k).hover();
  await page.waitForSelector("#tip:not([hidden])", { timeout: WAIT });
  const rows = await page.$$eval("#tip tr.alt", (trs) => trs.map((tr) => ({ tok: tr.querySelector("code").textContent, lp: tr.querySelector(".lp").textContent, chosen: tr.classList.contains("chosen") })));
  check(rows.length === wantTok.top_logprobs.length && rows.length === s.top_logprobs, `the tip shows ${rows.length} alternatives, the server gave ${wantTok.top_logprobs.length}`);
  wantTok.top_logprobs.forEach((a, i) => {
    check(rows[i].tok === label(a.token), `alternative ${i}: '${rows[i].tok}', the server's '${label(a.token)}'`);
    check(rows[i].lp === fmtLp(a.logprob), `alternative ${i}: logprob ${rows[i].lp}, the server's ${fmtLp(a.logprob)}`);
    check(rows[i].chosen === (a.token === wantTok.token), `alternative ${i}: marked chosen wrongly`);
  });
  const head = await page.textContent("#tip .head");
  check(head.includes(fmtLp(wantTok.logprob)), `the tip's head '${head}' lacks the token's logprob ${fmtLp(wantTok.logprob)}`);
  await page.mouse.move(5, 5);
  await page.waitForSelector("#tip", { state: "hidden", timeout: WAIT });
  ok(`hover: token ${k} '${label(wantTok.token)}' shows its ${rows.length} alternatives with the server's logprobs; leaving hides them`);

  // the second turn carries the first
  const q2 = "Who made the heaven and the earth?";
  await say(page, q2);
  const r2 = await lastReply(page);
  const w2 = await chat(A, { messages: [...msgs1, { role: "assistant", content: w1.json.choices[0].message.content }, { role: "user", content: q2 }], ...s, logprobs: true });
  sameReply(r2, w2.json, "turn 2");
  ok("turn 2: the request carries the conversation (text and logprobs equal the server's)");
  await last.locator(".tok").nth(r2.toks.findIndex((t) => t.text.trim())).hover(); // (last: the newest reply now)
  await page.waitForSelector("#tip:not([hidden])", { timeout: WAIT });
  await page.screenshot({ path: join(OUT, "chat.png") });
  await page.mouse.move(5, 5);

  // an error from the server, shown as it came
  await page.click("#new-chat");
  check((await page.locator(".msg").count()) === 0, "a new chat keeps the old messages");
  await settings(page, { max_tokens: 100000 });
  await say(page, "x");
  const err = await page.textContent(".msg.error");
  const wErr = await chat(A, { messages: [{ role: "system", content: system }, { role: "user", content: "x" }], ...s, max_tokens: 100000, logprobs: true });
  check(wErr.status === 400 && wErr.json.error.code === "context_length_exceeded", `the direct request: ${JSON.stringify(wErr.json)}`);
  check(err === `HTTP 400: ${wErr.json.error.message}`, `the page shows '${err}', the server says '${wErr.json.error.message}'`);
  check((await page.inputValue("#input")) === "x", "the refused message is not back in the input");
  ok(`errors: '${err}'`);

  // stop: a long greedy reply, stopped at its third token; the server cancels and frees the slot
  await page.click("#new-chat");
  await settings(page, { system: "", temperature: 0, top_p: 1, max_tokens: 400, seed: "", top_logprobs: 5 });
  let stopped = null;
  for (let attempt = 1; attempt <= 3 && !stopped; attempt++) {
    const cancelled0 = await metric(A, CANCELLED);
    await clickAtToken(page, "stop", 3);
    check(await page.isHidden("#stop"), "the stop button shows with no reply running");
    await page.fill("#input", "Tell me a long story.");
    await page.press("#input", "Enter");
    await page.waitForFunction(() => {
      const m = [...document.querySelectorAll(".msg.assistant")].pop();
      return m && m.querySelector(".stats .finish");
    }, null, { timeout: WAIT });
    const r = await lastReply(page);
    await until("the slot to be free", async () => (await metric(A, "muser_requests_running")) === 0);
    const cancelled = await metric(A, CANCELLED);
    if (r.finish.value === "stopped" && cancelled === cancelled0 + 1) stopped = r;
    else console.log(`note: attempt ${attempt}: the reply ended '${r.finish.value}' with ${r.toks.length} tokens, cancelled ${cancelled0} -> ${cancelled} (it finished before the stop): again`);
    await page.click("#new-chat");
  }
  check(stopped, "stop: the server never counted the stopped reply as cancelled (the page does not abort the request)");
  check(stopped.toks.length < 400, `stop: ${stopped.toks.length} tokens shown of 400`);
  check(await page.isVisible("#send"), "stop: the send button is not back");
  ok(`stop: the reply ends 'stopped' after ${stopped.toks.length} tokens; the server counts it cancelled and muser_requests_running is 0`);

  // a new chat while a reply streams: that reply is no part of the new conversation
  await clickAtToken(page, "new-chat", 3);
  await page.fill("#input", "Tell me a long story.");
  await page.press("#input", "Enter");
  await page.waitForFunction(() => !document.querySelector(".msg") && !document.getElementById("send").hidden, null, { timeout: WAIT });
  await settings(page, { max_tokens: 12 });
  await say(page, q1);
  const w3 = await chat(A, { messages: [{ role: "user", content: q1 }], temperature: 0, top_p: 1, max_tokens: 12, top_logprobs: 5, logprobs: true });
  sameReply(await lastReply(page), w3.json, "after a new chat during a reply");
  ok("a new chat during a reply: the next request carries none of it");

  check(!errors.length, `the page logged errors:\n${errors.join("\n")}`);
  await ctx.close();
}

// ---- 3. a phone ----

async function phone(browser) {
  const ctx = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
  const page = await ctx.newPage();
  const errors = watch(page);
  await page.goto(`${A}/`);
  await page.waitForFunction(() => document.getElementById("model-ctx").textContent !== "", null, { timeout: WAIT });
  check(await page.isHidden("#settings"), "phone: the settings cover the conversation from the start");
  await page.tap("#settings-toggle");
  check(await page.isVisible("#settings"), "phone: the settings do not open");
  await settings(page, { max_tokens: 40, seed: 3, top_logprobs: 3, temperature: 0.9 });
  await page.tap("#settings-toggle");
  check(await page.isHidden("#settings"), "phone: the settings do not close");
  await say(page, "Who made the heaven and the earth?");
  const r = await lastReply(page);
  check(r.toks.some((t) => t.text.trim()), `phone: no tokens (${JSON.stringify(r)})`);
  await page.locator(".msg.assistant .tok").nth(r.toks.findIndex((t) => t.text.trim())).tap();
  await page.waitForSelector("#tip:not([hidden])", { timeout: WAIT });
  const box = await page.locator("#tip").boundingBox();
  check(box.x >= 0 && box.x + box.width <= 390, `phone: the tip is off the screen (${JSON.stringify(box)})`);
  check((await page.locator("#tip tr.alt").count()) === 3, "phone: the tapped token's tip has not its 3 alternatives");
  // nothing wider than the screen, nor scrolling sideways inside the page
  const wide = await page.evaluate(() => [document.documentElement, ...document.querySelectorAll("header, .main, .log, .msg, .msg .body, #composer")]
    .filter((el) => el.scrollWidth > el.clientWidth || el.getBoundingClientRect().right > window.innerWidth + 0.5)
    .map((el) => `${el.tagName.toLowerCase()}.${el.className}: ${el.scrollWidth}px`));
  check(!wide.length, `phone: wider than the 390px screen: ${wide.join(", ")}`);
  const composer = await page.locator("#composer").boundingBox();
  check(composer && composer.y + composer.height <= 844 + 1, `phone: the composer is below the screen (${JSON.stringify(composer)})`);
  await page.screenshot({ path: join(OUT, "chat-phone.png") });
  await page.tap("h1");
  await page.waitForSelector("#tip", { state: "hidden", timeout: WAIT });
  check(!errors.length, `phone: the page logged errors:\n${errors.join("\n")}`);
  ok(`phone (390px): settings open and close, ${r.toks.length} tokens, a tap shows a token's alternatives on screen, nothing wider than the screen`);
  await ctx.close();
}

// ---- 4. the API key, 429 ----

async function apiKey(browser) {
  const ctx = await browser.newContext({ viewport: { width: 1000, height: 700 } });
  const page = await ctx.newPage();
  const errors = watch(page);
  await page.goto(`${B}/`);
  await page.waitForSelector("#key-dialog[open]", { timeout: WAIT });
  const reason = await page.textContent("#key-reason");
  const w401 = await (await fetch(`${B}/v1/models`)).json();
  check(reason.includes(w401.error.message), `the key dialog says '${reason}', the server '${w401.error.message}'`);
  await page.fill("#key", `${KEY}-not`);
  await page.click("#key-ok");
  await page.waitForFunction(() => document.getElementById("key-dialog").open && /refused/.test(document.getElementById("key-reason").textContent), null, { timeout: WAIT });
  await page.fill("#key", KEY);
  await page.click("#key-ok");
  const model = (await (await fetch(`${B}/v1/models`, { headers: AUTH })).json()).data[0];
  await page.waitForFunction((id) => document.getElementById("model-name").textContent === id, model.id, { timeout: WAIT });
  check(await page.evaluate(() => sessionStorage.getItem("muser.apiKey")) === KEY, "the key is not in sessionStorage");
  await settings(page, { max_tokens: 8, seed: 5 });
  await say(page, "In the beginning");
  const r = await lastReply(page);
  check(r && r.toks.length > 0 && r.finish.value !== "error", `a reply with the key: ${JSON.stringify(r)}`);
  await page.reload();
  await page.waitForFunction((id) => document.getElementById("model-name").textContent === id, model.id, { timeout: WAIT });
  check(!(await page.evaluate(() => document.getElementById("key-dialog").open)), "the page asks for the key again after a reload");
  ok("api key: asked once on 401 with the server's message, asked again when refused, kept in sessionStorage across a reload");

  // 429: a request holds the one slot (its stream unread), the queue is 0
  await settings(page, { max_tokens: 8, seed: 5 });
  let shown = null;
  for (let attempt = 1; attempt <= 3 && !shown; attempt++) {
    const hold = new AbortController();
    const held = await fetch(`${B}/v1/chat/completions`, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...AUTH },
      body: JSON.stringify({ messages: [{ role: "user", content: "Tell me a long story." }], temperature: 0, max_tokens: 400, logprobs: true, top_logprobs: 20, stream: true }),
      signal: hold.signal,
    });
    check(held.status === 200, `the holding request: ${held.status}`);
    const before = await page.locator(".msg.error").count();
    await say(page, "In the beginning");
    hold.abort();
    await until("the keyed server's slot to be free", async () => (await metric(B, "muser_requests_running", AUTH)) === 0);
    if ((await page.locator(".msg.error").count()) > before) shown = await page.locator(".msg.error").last().textContent();
    else console.log(`note: attempt ${attempt}: the holding request ended before the page's: again`);
  }
  check(shown && shown.startsWith("HTTP 429: ") && /try again later/.test(shown), `429: the page shows '${shown}'`);
  ok(`429: '${shown}'`);
  check(!errors.length, `api key: the page logged errors:\n${errors.join("\n")}`);
  await ctx.close();
}

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--disable-dev-shm-usage"] });
let status = 0;
try {
  await files();
  await desktop(browser);
  await phone(browser);
  await apiKey(browser);
  console.log(`screenshots: ${join(OUT, "chat.png")}, ${join(OUT, "chat-phone.png")}`);
} catch (e) {
  console.error(e instanceof Fail ? `FAIL: ${e.message}` : `FAIL: ${e.stack || e}`);
  status = 1;
} finally {
  await browser.close();
}
process.exit(status);

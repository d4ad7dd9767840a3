// client.mjs — the openai npm client against `muser serve` (tests/cli_serve_openai.sh):
// completions, chat, a streamed chat and logprobs, through the client's own request and response
// handling. Exits non-zero with a message on the first thing that is not as the API promises.
import OpenAI from "openai";

const [port, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://localhost:${port}/v1`, apiKey: key, maxRetries: 0 });
const fail = (msg) => { console.error(`FAIL: ${msg}`); process.exit(1); };

const models = await client.models.list();
if (!models.data.length || !models.data[0].id) fail("models.list is empty");
const model = models.data[0].id;

const c = await client.completions.create({ model, prompt: "The Lord is my shepherd;", max_tokens: 12, temperature: 0, logprobs: 2 });
if (c.choices[0].finish_reason !== "length" || !c.choices[0].text) fail(`completion: ${JSON.stringify(c)}`);
if (c.usage.completion_tokens !== 12) fail("completion: usage");
if (c.choices[0].logprobs.token_logprobs.length !== 12) fail("completion: logprobs");

const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "In the beginning" }], max_tokens: 10, seed: 3, logprobs: true, top_logprobs: 2,
});
const m = chat.choices[0];
if (m.message.role !== "assistant" || typeof m.message.content !== "string") fail(`chat: ${JSON.stringify(chat)}`);
if (!m.logprobs.content.length || !m.logprobs.content[0].bytes) fail("chat: logprobs");

const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "In the beginning" }], max_tokens: 10, seed: 3, stream: true,
  stream_options: { include_usage: true },
});
let text = "", usage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.choices.length) {
    text += chunk.choices[0].delta.content ?? "";
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  if (chunk.usage) usage = chunk.usage;
}
if (text !== m.message.content) fail(`stream: '${text}' differs from the same request unstreamed: '${m.message.content}'`);
if (!usage || usage.completion_tokens !== chat.usage.completion_tokens) fail("stream: usage");
if (!finish) fail("stream: no finish_reason");

try {
  await client.completions.create({ model, prompt: "x", best_of: 3 });
  fail("an unsupported field was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError) || !/best_of/.test(e.message)) fail(`unsupported field: ${e}`);
}
console.log(`openai client: completions, chat (logprobs, bytes), a streamed chat equal to the unstreamed one, a 400: ok`);

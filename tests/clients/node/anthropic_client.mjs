// The official Anthropic TypeScript SDK (@anthropic-ai/sdk) against the server's Messages API,
// on Node 20+.
//
// Usage: node anthropic_client.mjs BASE_URL MODEL. The same protocol as openai_client.mjs:
// each exported case_<name>(obs) records what came back in obs and throws on a failure; stdout
// carries one JSON report and nothing else. Pinned in package.json: @anthropic-ai/sdk 1.15.0
// (Node 20 LTS or later, by its README).
//
// The SDK's types have no `temperature` or `seed` any more; it sends every key of the params
// object as it is (create() spreads them into the body), so greedy requests say
// `temperature: 0` and sampled ones `seed` beside the typed fields, as a JavaScript user
// would. Tool inputs are checked with zod schemas written to match the tools' input_schema.

import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { fileURLToPath } from "node:url";

import Anthropic from "@anthropic-ai/sdk";
import { z } from "zod";

const REQUEST_TIMEOUT_MS = 60_000;
const CASE_TIMEOUT_MS = 120_000;
const FORCED_MAX_TOKENS = 300;
const TEXT_MAX_TOKENS = 24;
const SEEDS = [0, 1, 2, 3];
const GREEDY = { temperature: 0 };
const [BASE_URL, MODEL] = process.argv.slice(2);
if (!BASE_URL || !MODEL) {
  console.error("usage: node anthropic_client.mjs BASE_URL MODEL");
  process.exit(2);
}

// Every request the SDK makes goes through this fetch: anything off loopback is refused. The
// last JSON body sent is kept, to see what the SDK put on the wire.
const BLOCKED = [];
const LOOPBACK = new Set(["127.0.0.1", "localhost", "[::1]"]);
let lastBody = null;
function loopbackFetch(url, init) {
  const host = new URL(typeof url === "string" ? url : url.url ?? String(url)).hostname;
  if (!LOOPBACK.has(host)) {
    BLOCKED.push(host);
    return Promise.reject(new Error(`connections outside loopback are refused (${host})`));
  }
  lastBody = typeof init?.body === "string" ? JSON.parse(init.body) : null;
  return fetch(url, init);
}

/** The untyped fields were sent as given (the SDK's types have neither). */
function sent(obs, fields) {
  const got = Object.fromEntries(Object.keys(fields).map((k) => [k, lastBody?.[k]]));
  obs.sent = got;
  deepEqual(got, fields, "fields in the request body");
}

// An explicit apiKey: the SDK then reads no credential from the environment.
const client = new Anthropic({
  baseURL: BASE_URL,
  apiKey: "unused",
  maxRetries: 0,
  timeout: REQUEST_TIMEOUT_MS,
  fetch: loopbackFetch,
});

function check(condition, message) {
  if (!condition) throw new Error(`assertion failed: ${message}`);
}

/** JSON with object keys sorted: equal for equal data, whatever order the keys came in. */
function canonical(value) {
  return JSON.stringify(value, (_key, v) => (v && typeof v === "object" && !Array.isArray(v)
    ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, v[k]])) : v));
}

function deepEqual(a, b, what) {
  check(canonical(a) === canonical(b),
    `${what}: ${canonical(a)?.slice(0, 300)} != ${canonical(b)?.slice(0, 300)}`);
}

function nonce() {
  return randomBytes(16).toString("hex");
}

function user(text) {
  return [{ role: "user", content: text }];
}

function kinds(message) {
  return message.content.map((block) => block.type);
}

function checkUsage(obs, usage, maxTokens) {
  obs.usage = usage;
  check(usage, "no usage");
  for (const key of ["input_tokens", "output_tokens", "cache_creation_input_tokens",
    "cache_read_input_tokens"]) {
    check(Number.isInteger(usage[key]) && usage[key] >= 0, `usage.${key}: ${usage[key]}`);
  }
  check(usage.input_tokens > 0, `input_tokens ${usage.input_tokens}`);
  check(usage.output_tokens > 0 && usage.output_tokens <= maxTokens,
    `output_tokens ${usage.output_tokens} (max_tokens ${maxTokens})`);
  check(usage.cache_creation_input_tokens === 0, JSON.stringify(usage));
}

// The tools, as their input_schema says them (a nested object through $defs, an enum, a
// nullable field, an optional integer; objects open to other keys, as JSON Schema has them by
// default, but for get_time's), and zod schemas that accept what those accept.
const WEATHER = {
  name: "get_weather",
  description: "The weather forecast for a place.",
  input_schema: {
    type: "object",
    $defs: {
      Place: {
        type: "object",
        properties: {
          city: { type: "string", description: "The city's name" },
          country: { anyOf: [{ type: "string" }, { type: "null" }],
            description: "ISO 3166 country code" },
        },
        required: ["city"],
      },
      Unit: { type: "string", enum: ["celsius", "fahrenheit"] },
    },
    properties: {
      place: { $ref: "#/$defs/Place" },
      unit: { $ref: "#/$defs/Unit" },
      days: { type: "integer", description: "How many days ahead" },
    },
    required: ["place", "unit"],
  },
};
const CLOCK = {
  name: "get_time",
  description: "The time in a timezone.",
  input_schema: {
    type: "object",
    properties: { tz: { type: "string", enum: ["UTC", "CET"] } },
    required: ["tz"],
    additionalProperties: false,
  },
};
const ZOD = {
  get_weather: z.object({
    place: z.object({ city: z.string(), country: z.string().nullable().optional() }),
    unit: z.enum(["celsius", "fahrenheit"]),
    days: z.number().int().optional(),
  }),
  get_time: z.strictObject({ tz: z.enum(["UTC", "CET"]) }),
};
const WEATHER_ASK = user("What is the weather in Paris? Use the tools.");

function checkToolUse(obs, message, only) {
  const calls = message.content.filter((block) => block.type === "tool_use");
  obs.content = message.content;
  obs.stop_reason = message.stop_reason;
  check(calls.length > 0, `no tool_use block; content ${JSON.stringify(message.content)}`);
  check(message.stop_reason === "tool_use", `stop_reason ${message.stop_reason}`);
  for (const call of calls) {
    check(typeof call.id === "string" && call.id.startsWith("toolu_"), `id ${call.id}`);
    check(call.name in ZOD, `unknown tool ${call.name}`);
    if (only) check(call.name === only, `called ${call.name}, not ${only}`);
    check(call.input && typeof call.input === "object" && !Array.isArray(call.input),
      `input ${JSON.stringify(call.input)}`);
    const parsed = ZOD[call.name].safeParse(call.input);
    check(parsed.success,
      `${call.name} input ${JSON.stringify(call.input)}: ${parsed.error?.message}`);
  }
  return calls;
}

/** Streams a request with the SDK's helper: the event types in order, and the final message. */
async function streamed(params) {
  const stream = client.messages.stream(params);
  const events = [];
  for await (const event of stream) events.push(event);
  return { events, message: await stream.finalMessage() };
}

async function checkStreamEqualsCreate(obs, thinking) {
  const ask = { model: MODEL, max_tokens: TEXT_MAX_TOKENS, ...GREEDY,
    messages: user(`Tell me something ${nonce()}`), ...(thinking ? { thinking } : {}) };
  const whole = await client.messages.create(ask);
  const { events, message } = await streamed(ask);
  obs.whole = whole;
  obs.streamed = message;
  deepEqual(message.content, whole.content, "streamed content");
  deepEqual([message.stop_reason, message.stop_sequence], [whole.stop_reason,
    whole.stop_sequence], "stop_reason, stop_sequence");
  check(message.usage.output_tokens === whole.usage.output_tokens,
    `output_tokens ${message.usage.output_tokens} != ${whole.usage.output_tokens}`);
  check(message.usage.input_tokens + message.usage.cache_read_input_tokens ===
    whole.usage.input_tokens + whole.usage.cache_read_input_tokens, "prompt sizes differ");
  check(message.id.startsWith("msg_") && message.model === MODEL, JSON.stringify(message));
  check(events[0]?.type === "message_start" && events.at(-1)?.type === "message_stop",
    `events ${events.map((e) => e.type)}`);
  return whole;
}

export async function case_messages_create(obs) {
  const out = await client.messages.create({ model: MODEL, max_tokens: TEXT_MAX_TOKENS,
    system: "Be brief.", messages: user("Hello"), ...GREEDY });
  sent(obs, GREEDY);
  obs.message = out;
  check(out.type === "message" && out.role === "assistant", `type ${out.type}, ${out.role}`);
  check(typeof out.id === "string" && out.id.startsWith("msg_"), `id ${out.id}`);
  check(out.model === MODEL, `model ${out.model}`);
  deepEqual(kinds(out), ["text"], "content block types");
  check(typeof out.content[0].text === "string", JSON.stringify(out.content[0]));
  check(["end_turn", "max_tokens"].includes(out.stop_reason), `stop_reason ${out.stop_reason}`);
  check(out.stop_sequence === null, `stop_sequence ${out.stop_sequence}`);
  checkUsage(obs, out.usage, TEXT_MAX_TOKENS);
}

export async function case_stream_final_message_equals_create(obs) {
  await checkStreamEqualsCreate(obs, null);
}

export async function case_stream_final_message_equals_create_thinking(obs) {
  const whole = await checkStreamEqualsCreate(obs, { type: "enabled", budget_tokens: 6 });
  check(kinds(whole)[0] === "thinking", `blocks ${kinds(whole)}`);
}

export async function case_stream_events(obs) {
  const { events, message } = await streamed({ model: MODEL, max_tokens: TEXT_MAX_TOKENS,
    ...GREEDY, messages: user(`Say hello ${nonce()}`) });
  const types = events.map((e) => e.type);
  obs.events = types;
  check(types[0] === "message_start", `first event ${types[0]}`);
  check(types.at(-1) === "message_stop", `last event ${types.at(-1)}`);
  check(types.filter((t) => t === "message_start").length === 1 &&
    types.filter((t) => t === "message_stop").length === 1, "one message_start and stop");
  check(types.at(-2) === "message_delta", `before message_stop: ${types.at(-2)}`);
  const starts = events.filter((e) => e.type === "content_block_start");
  const stops = events.filter((e) => e.type === "content_block_stop");
  deepEqual(starts.map((e) => e.index), message.content.map((_b, i) => i), "block starts");
  deepEqual(stops.map((e) => e.index), message.content.map((_b, i) => i), "block stops");
  const text = events.filter((e) => e.type === "content_block_delta" &&
    e.delta.type === "text_delta").map((e) => e.delta.text).join("");
  const final = message.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  check(text === final, "the deltas' text is not the final message's");
  // (message_start's message is the object the SDK then builds its snapshot in.)
  const start = events[0].message;
  check(start.id === message.id && start.id.startsWith("msg_"), `ids ${start.id} ${message.id}`);
  const delta = events.at(-2);
  check(delta.delta.stop_reason === message.stop_reason, JSON.stringify(delta));
  checkUsage(obs, message.usage, TEXT_MAX_TOKENS);
}

async function forced(obs, toolChoice, only) {
  obs.seeds = {};
  for (const seed of SEEDS) {
    const seen = {};
    obs.seeds[seed] = seen;
    // Sampled (the default temperature), each seed its own answer: every one must validate.
    const out = await client.messages.create({ model: MODEL, max_tokens: FORCED_MAX_TOKENS,
      messages: WEATHER_ASK, tools: [WEATHER, CLOCK], tool_choice: toolChoice, seed });
    sent(seen, { seed, tool_choice: toolChoice });
    checkToolUse(seen, out, only);
  }
}

export async function case_tool_choice_any_validates(obs) {
  await forced(obs, { type: "any" }, null);
}

export async function case_tool_choice_tool_validates(obs) {
  await forced(obs, { type: "tool", name: "get_weather" }, "get_weather");
}

export async function case_tool_round_trip(obs) {
  const asked = user("What time is it in Berlin?");
  const first = await client.messages.create({ model: MODEL, max_tokens: FORCED_MAX_TOKENS,
    messages: asked, tools: [CLOCK], tool_choice: { type: "any" }, seed: 1 });
  const [call] = checkToolUse(obs, first, "get_time");
  const { message: answer } = await streamed({ model: MODEL, max_tokens: 16, tools: [CLOCK],
    ...GREEDY, messages: [...asked, { role: "assistant", content: first.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: call.id,
        content: [{ type: "text", text: "12:00" }] }] }] });
  obs.answer = answer;
  check(["end_turn", "max_tokens", "tool_use"].includes(answer.stop_reason),
    `stop_reason ${answer.stop_reason}`);
  const prompt = (m) => m.usage.input_tokens + m.usage.cache_read_input_tokens;
  check(prompt(answer) > prompt(first), `the answer's prompt (${prompt(answer)} tokens) is ` +
    `no longer than the question's (${prompt(first)})`);
}

export async function case_thinking_enabled_and_disabled(obs) {
  const text = `Think about ${nonce()}`;
  const on = await client.messages.create({ model: MODEL, max_tokens: 30, messages: user(text),
    thinking: { type: "enabled", budget_tokens: 8 }, ...GREEDY });
  obs.on = on.content;
  check(kinds(on)[0] === "thinking" && !kinds(on).slice(1).includes("thinking"),
    `blocks ${kinds(on)}`);
  check(typeof on.content[0].thinking === "string" && on.content[0].thinking.length > 0,
    JSON.stringify(on.content[0]));
  check(typeof on.content[0].signature === "string", JSON.stringify(on.content[0]));
  const off = await client.messages.create({ model: MODEL, max_tokens: 30, messages: user(text),
    thinking: { type: "disabled" }, ...GREEDY });
  const absent = await client.messages.create({ model: MODEL, max_tokens: 30,
    messages: user(text), ...GREEDY });
  obs.off = off.content;
  check(!kinds(off).includes("thinking"), `disabled gave blocks ${kinds(off)}`);
  check(!kinds(absent).includes("thinking"), `absent gave blocks ${kinds(absent)}`);
  deepEqual(off.content, absent.content, "disabled and absent thinking");
}

export async function case_count_tokens_and_prefix_cache(obs) {
  // Never seen before from its first tokens on (the system prompt), and long enough for the
  // prefix cache to hold whole blocks of it.
  const ask = { model: MODEL, system: `${nonce()}: you answer questions about the weather.`,
    messages: user(`Is it going to rain tomorrow in ${Array.from({ length: 8 }, nonce)
      .join(" ")}? Say which of these places will be dry, and why, in a few words.`),
    tools: [WEATHER] };
  const counted = (await client.messages.countTokens(ask)).input_tokens;
  obs.counted = counted;
  check(Number.isInteger(counted) && counted > 100, `count ${counted}`);
  const first = await client.messages.create({ ...ask, max_tokens: 8, ...GREEDY });
  obs.first = first.usage;
  check(first.usage.input_tokens === counted,
    `input_tokens ${first.usage.input_tokens}, countTokens ${counted}`);
  check(first.usage.cache_read_input_tokens === 0, JSON.stringify(first.usage));
  const second = await client.messages.create({ ...ask, max_tokens: 8, ...GREEDY });
  obs.second = second.usage;
  check(second.usage.cache_read_input_tokens > 0, JSON.stringify(second.usage));
  check(second.usage.input_tokens + second.usage.cache_read_input_tokens === counted,
    `${JSON.stringify(second.usage)}, countTokens ${counted}`);
}

export async function case_bad_request(obs) {
  try {
    await client.messages.create({ model: MODEL, max_tokens: 5, messages: user("hi"),
      thinking: { type: "enabled", budget_tokens: 5 } });
  } catch (err) {
    // The SDK keeps the whole body as err.error ({type: "error", error: {type, message}}),
    // and its error.type as err.type.
    obs.error = { name: err?.constructor?.name, status: err?.status, body: err?.error,
      type: err?.type, message: err?.message };
    check(err instanceof Anthropic.BadRequestError,
      `got ${err?.constructor?.name}: ${err?.message}`);
    check(err.status === 400, `status ${err.status}`);
    check(err.error?.type === "error", `body ${JSON.stringify(err.error)}`);
    check(err.error?.error?.type === "invalid_request_error", `body ${JSON.stringify(err.error)}`);
    check(err.type === "invalid_request_error", `type ${err.type}`);
    check(String(err.error.error.message).includes("budget_tokens"), err.message);
    return;
  }
  throw new Error("budget_tokens equal to max_tokens was accepted");
}

export async function case_unknown_model_is_not_found(obs) {
  try {
    await client.messages.create({ model: "claude-nonesuch", max_tokens: 5, messages: user("hi") });
  } catch (err) {
    obs.error = { name: err?.constructor?.name, status: err?.status, body: err?.error };
    check(err instanceof Anthropic.NotFoundError, `got ${err?.constructor?.name}: ${err?.message}`);
    check(err.error?.error?.type === "not_found_error", `body ${JSON.stringify(err.error)}`);
    return;
  }
  throw new Error("no error for an unknown model");
}

function cut(value, depth = 0) {
  if (typeof value === "string") {
    return value.length <= 400 ? value : `${value.slice(0, 400)}...[${value.length} chars]`;
  }
  if (Array.isArray(value)) return value.slice(0, 40).map((v) => cut(v, depth + 1));
  if (value && typeof value === "object") {
    if (depth > 8) return "...";
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, cut(v, depth + 1)]));
  }
  return value ?? null;
}

function errorDetail(err) {
  const frames = String(err?.stack ?? "").split("\n").slice(1)
    .filter((line) => line.includes("anthropic_client.mjs")).slice(0, 4);
  const head = `${err?.constructor?.name ?? "Error"}: ${err?.message ?? err}`;
  return [head, ...frames.map((f) => `  ${f.trim()}`)].join("\n");
}

async function main() {
  const self = await import(import.meta.url);
  const here = fileURLToPath(import.meta.url);
  // Definition order, as the pytest side names the cases.
  const names = [...readFileSync(here, "utf8").matchAll(/^export async function case_(\w+)/gm)]
    .map((m) => m[1]);
  const cases = {};
  for (const name of names) {
    const obs = {};
    const started = performance.now();
    let timer;
    try {
      await Promise.race([
        self[`case_${name}`](obs),
        new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error(`the case ran past ${CASE_TIMEOUT_MS} ms`)),
            CASE_TIMEOUT_MS);
        }),
      ]);
      cases[name] = { ok: true, error: null };
    } catch (err) {
      cases[name] = { ok: false, error: errorDetail(err) };
    } finally {
      clearTimeout(timer);
    }
    cases[name].observed = cut(obs);
    cases[name].seconds = Math.round(performance.now() - started) / 1000;
    console.error(`[${cases[name].ok ? "ok" : "FAILED"}] ${name} (${cases[name].seconds} s)`);
  }
  cases.nothing_left_loopback = {
    ok: BLOCKED.length === 0,
    error: BLOCKED.length ? `connections outside loopback were attempted: ${BLOCKED}` : null,
    observed: { blocked: BLOCKED }, seconds: 0,
  };
  const version = (pkg) => JSON.parse(readFileSync(
    new URL(`./node_modules/${pkg}/package.json`, import.meta.url), "utf8")).version;
  const report = { script: basename(here), cases,
    versions: { node: process.versions.node, "@anthropic-ai/sdk": version("@anthropic-ai/sdk"),
      zod: version("zod") } };
  process.stdout.write(`${JSON.stringify(report)}\n`);
}

// After this module has finished evaluating, so that importing itself finds every case.
setImmediate(() => {
  main().catch((err) => {
    console.error(err);
    process.exit(1);
  });
});

// The openai npm package (with its zod helpers) against the server, on Node 20+.
//
// Usage: node openai_client.mjs BASE_URL MODEL. Like the Python scripts (see
// ../scripts/_harness.py), each exported case_<name>(obs) records what came back in obs and
// throws on a failure; stdout carries one JSON report and nothing else. Tools and response
// formats are made by zodFunction / zodResponseFormat from zod schemas (a nested object, enums,
// a nullable field, unbounded strings), as the SDK's users write them. Pinned in package.json:
// openai 6.49.0, the newest release that runs on Node 20 (7.x wants Node 22), and zod 4.

import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { fileURLToPath } from "node:url";

import OpenAI from "openai";
import { zodFunction, zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";

const REQUEST_TIMEOUT_MS = 60_000;
const CASE_TIMEOUT_MS = 120_000;
const FORCED_MAX_TOKENS = 200;
const TEXT_MAX_TOKENS = 64;
const SEED = 1234;
const [BASE_URL, MODEL] = process.argv.slice(2);
if (!BASE_URL || !MODEL) {
  console.error("usage: node openai_client.mjs BASE_URL MODEL");
  process.exit(2);
}

// Every request the SDK makes goes through this fetch: anything off loopback is refused.
const BLOCKED = [];
const LOOPBACK = new Set(["127.0.0.1", "localhost", "[::1]"]);
function loopbackFetch(url, init) {
  const host = new URL(typeof url === "string" ? url : url.url ?? String(url)).hostname;
  if (!LOOPBACK.has(host)) {
    BLOCKED.push(host);
    return Promise.reject(new Error(`connections outside loopback are refused (${host})`));
  }
  return fetch(url, init);
}

const client = new OpenAI({
  baseURL: `${BASE_URL}/v1`,
  apiKey: "unused",
  maxRetries: 0,
  timeout: REQUEST_TIMEOUT_MS,
  fetch: loopbackFetch,
});

function check(condition, message) {
  if (!condition) throw new Error(`assertion failed: ${message}`);
}

function deepEqual(a, b, what) {
  check(JSON.stringify(a) === JSON.stringify(b),
    `${what}: ${JSON.stringify(a)?.slice(0, 300)} != ${JSON.stringify(b)?.slice(0, 300)}`);
}

function finished(finishReason, ...allowed) {
  check(allowed.includes(finishReason),
    `finish_reason ${JSON.stringify(finishReason)}, expected one of ${JSON.stringify(allowed)}` +
      (finishReason === "length" ? " (the output was cut off or never closed)" : ""));
}

function checkUsage(obs, usage) {
  obs.usage = usage;
  check(usage, "no usage");
  check(usage.prompt_tokens > 0 && usage.completion_tokens > 0, JSON.stringify(usage));
  check(usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
    JSON.stringify(usage));
}

const Unit = z.enum(["celsius", "fahrenheit"]);
const Location = z.object({
  city: z.string().describe("The city's name"),
  country: z.string().nullable().describe("ISO 3166 country code"),
});
const GetWeather = z.object({ location: Location, unit: Unit });
const GetTime = z.object({ city: z.string() });
const Forecast = z.object({
  location: Location,
  unit: Unit,
  days: z.array(z.object({
    weekday: z.string(),
    high: z.number(),
    sky: z.enum(["sunny", "cloudy", "rain"]).nullable(),
  })),
});
const ZOD = { get_weather: GetWeather, get_time: GetTime };
const TOOLS = [
  zodFunction({ name: "get_weather", parameters: GetWeather,
    description: "Get the current weather for a location." }),
  zodFunction({ name: "get_time", parameters: GetTime, description: "Get the local time." }),
];
const HELLO = [{ role: "user", content: "Say hello in five words." }];
const WEATHER = [{ role: "user", content: "What is the weather in Paris, in celsius? Use the tools." }];
const FORECAST = [{ role: "user", content: "Give me a three-day weather forecast for Paris as JSON." }];
const SAMPLING = { temperature: 0, seed: SEED };

function checkCalls(obs, message) {
  const calls = message.tool_calls ?? [];
  obs.tool_calls = calls.map((c) => [c.function.name, c.function.arguments]);
  obs.content = message.content;
  check(calls.length > 0, `no tool call parsed; content ${JSON.stringify(message.content)}`);
  for (const call of calls) {
    check(call.type === "function" && call.id, JSON.stringify(call));
    check(call.function.name in ZOD, `unknown function ${call.function.name}`);
    ZOD[call.function.name].parse(JSON.parse(call.function.arguments)); // throws when invalid
  }
  return calls;
}

async function streamedChat(params) {
  const stream = await client.chat.completions.create({
    model: MODEL, stream: true, stream_options: { include_usage: true }, ...SAMPLING, ...params,
  });
  let text = "", finish = null, usage = null;
  const calls = [];
  for await (const chunk of stream) {
    usage = chunk.usage ?? usage;
    for (const choice of chunk.choices) {
      text += choice.delta.content ?? "";
      for (const d of choice.delta.tool_calls ?? []) {
        calls[d.index] ??= { id: null, name: "", arguments: "" };
        calls[d.index].id = d.id ?? calls[d.index].id;
        calls[d.index].name += d.function?.name ?? "";
        calls[d.index].arguments += d.function?.arguments ?? "";
      }
      finish = choice.finish_reason ?? finish;
    }
  }
  return { text, calls, finish, usage };
}

export async function case_models_list(obs) {
  const ids = [];
  for await (const model of client.models.list()) ids.push(model.id);
  obs.ids = ids;
  check(ids.includes(MODEL), `${MODEL} not among ${ids}`);
}

export async function case_chat(obs) {
  const out = await client.chat.completions.create({
    model: MODEL, messages: HELLO, max_tokens: TEXT_MAX_TOKENS, ...SAMPLING });
  const choice = out.choices[0];
  obs.content = choice.message.content;
  obs.finish = choice.finish_reason;
  check(out.model === MODEL && typeof choice.message.content === "string", JSON.stringify(out));
  finished(choice.finish_reason, "stop", "length");
  checkUsage(obs, out.usage);
}

export async function case_chat_stream_equals_plain(obs) {
  const plain = await client.chat.completions.create({
    model: MODEL, messages: HELLO, max_tokens: TEXT_MAX_TOKENS, ...SAMPLING });
  const { text, calls, finish, usage } = await streamedChat({
    messages: HELLO, max_tokens: TEXT_MAX_TOKENS });
  obs.plain = plain.choices[0].message.content;
  obs.streamed = text;
  check(text === plain.choices[0].message.content, "streamed text differs");
  check(calls.length === 0 && finish === plain.choices[0].finish_reason, `finish ${finish}`);
  checkUsage(obs, usage);
}

export async function case_completions_and_stream(obs) {
  const params = { model: MODEL, prompt: "The capital of France is",
    max_tokens: TEXT_MAX_TOKENS, ...SAMPLING };
  const plain = await client.completions.create(params);
  let text = "", usage = null;
  const stream = await client.completions.create({
    ...params, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    usage = chunk.usage ?? usage;
    for (const choice of chunk.choices) text += choice.text;
  }
  obs.plain = plain.choices[0].text;
  obs.streamed = text;
  check(text === plain.choices[0].text, "streamed text differs");
  checkUsage(obs, plain.usage);
  checkUsage(obs, usage);
}

export async function case_tools_auto(obs) {
  const out = await client.chat.completions.create({ model: MODEL, messages: WEATHER,
    tools: TOOLS, tool_choice: "auto", max_tokens: FORCED_MAX_TOKENS, ...SAMPLING });
  const choice = out.choices[0];
  obs.finish = choice.finish_reason;
  if (choice.message.tool_calls?.length) checkCalls(obs, choice.message); // may call or answer
  finished(choice.finish_reason, "stop", "length", "tool_calls");
  checkUsage(obs, out.usage);
}

export async function case_tools_required(obs) {
  const out = await client.chat.completions.create({ model: MODEL, messages: WEATHER,
    tools: TOOLS, tool_choice: "required", max_tokens: FORCED_MAX_TOKENS, ...SAMPLING });
  obs.finish = out.choices[0].finish_reason;
  checkCalls(obs, out.choices[0].message);
  finished(out.choices[0].finish_reason, "tool_calls");
  checkUsage(obs, out.usage);
}

export async function case_tools_named_parse(obs) {
  // parse(): the SDK checks the arguments against the zod schema and hands back the object.
  const out = await client.chat.completions.parse({ model: MODEL, messages: WEATHER,
    tools: TOOLS, tool_choice: { type: "function", function: { name: "get_weather" } },
    max_tokens: FORCED_MAX_TOKENS, ...SAMPLING });
  const message = out.choices[0].message;
  obs.finish = out.choices[0].finish_reason;
  const calls = checkCalls(obs, message);
  deepEqual(calls.map((c) => c.function.name), ["get_weather"], "called");
  check(calls[0].function.parsed_arguments?.location, "no parsed_arguments");
  finished(out.choices[0].finish_reason, "tool_calls", "stop");
}

export async function case_tools_required_stream_equals_plain(obs) {
  const params = { messages: WEATHER, tools: TOOLS, tool_choice: "required",
    parallel_tool_calls: false, max_tokens: FORCED_MAX_TOKENS };
  const plain = await client.chat.completions.create({ model: MODEL, ...SAMPLING, ...params });
  const { calls, finish, usage } = await streamedChat(params);
  obs.streamed_calls = calls;
  obs.finish = finish;
  const plainCalls = checkCalls(obs, plain.choices[0].message);
  finished(finish, "tool_calls");
  deepEqual(calls.map((c) => [c.name, c.arguments]),
    plainCalls.map((c) => [c.function.name, c.function.arguments]), "streamed calls");
  checkUsage(obs, usage);
}

export async function case_parse_response_format(obs) {
  const out = await client.chat.completions.parse({ model: MODEL, messages: FORECAST,
    response_format: zodResponseFormat(Forecast, "forecast"), max_tokens: FORCED_MAX_TOKENS,
    ...SAMPLING });
  obs.content = out.choices[0].message.content;
  obs.finish = out.choices[0].finish_reason;
  finished(out.choices[0].finish_reason, "stop");
  Forecast.parse(out.choices[0].message.parsed);
}

export async function case_stream_response_format(obs) {
  const runner = client.chat.completions.stream({ model: MODEL, messages: FORECAST,
    response_format: zodResponseFormat(Forecast, "forecast"), max_tokens: FORCED_MAX_TOKENS,
    ...SAMPLING });
  const final = await runner.finalChatCompletion();
  obs.content = final.choices[0].message.content;
  obs.finish = final.choices[0].finish_reason;
  finished(final.choices[0].finish_reason, "stop");
  Forecast.parse(final.choices[0].message.parsed);
}

export async function case_json_object(obs) {
  const out = await client.chat.completions.create({ model: MODEL, messages: FORECAST,
    response_format: { type: "json_object" }, max_tokens: FORCED_MAX_TOKENS, ...SAMPLING });
  obs.content = out.choices[0].message.content;
  obs.finish = out.choices[0].finish_reason;
  finished(out.choices[0].finish_reason, "stop");
  const value = JSON.parse(out.choices[0].message.content);
  check(value && typeof value === "object" && !Array.isArray(value), "not a JSON object");
}

export async function case_legacy_functions(obs) {
  // The deprecated spelling: honoured (a function_call comes back), not silently dropped.
  const fn = TOOLS[0].function;
  const out = await client.chat.completions.create({ model: MODEL, messages: WEATHER,
    functions: [{ name: fn.name, description: fn.description, parameters: fn.parameters }],
    function_call: { name: fn.name }, max_tokens: FORCED_MAX_TOKENS, ...SAMPLING });
  const message = out.choices[0].message;
  obs.message = message;
  obs.finish = out.choices[0].finish_reason;
  check(message.function_call, "no function_call in the answer");
  check(message.function_call.name === "get_weather", message.function_call.name);
  GetWeather.parse(JSON.parse(message.function_call.arguments));
  finished(out.choices[0].finish_reason, "function_call", "stop");
}

export async function case_unknown_model_is_not_found(obs) {
  try {
    await client.chat.completions.create({ model: "no-such-model", messages: HELLO,
      max_tokens: 4 });
  } catch (err) {
    obs.error = { name: err?.constructor?.name, status: err?.status, message: err?.message };
    check(err instanceof OpenAI.NotFoundError, `got ${err?.constructor?.name}: ${err?.message}`);
    return;
  }
  throw new Error("no error for an unknown model");
}

export async function case_bad_request(obs) {
  try {
    await client.chat.completions.create({ model: MODEL, messages: HELLO, max_tokens: 4,
      temperature: 5 });
  } catch (err) {
    obs.error = { name: err?.constructor?.name, status: err?.status, message: err?.message };
    check(err instanceof OpenAI.BadRequestError, `got ${err?.constructor?.name}: ${err?.message}`);
    check(String(err.message).includes("temperature"), err.message);
    return;
  }
  throw new Error("temperature 5 was accepted");
}

function cut(value, depth = 0) {
  if (typeof value === "string") {
    return value.length <= 400 ? value : `${value.slice(0, 400)}...[${value.length} chars]`;
  }
  if (Array.isArray(value)) return value.slice(0, 20).map((v) => cut(v, depth + 1));
  if (value && typeof value === "object") {
    if (depth > 8) return "...";
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, cut(v, depth + 1)]));
  }
  return value ?? null;
}

function errorDetail(err) {
  const frames = String(err?.stack ?? "").split("\n").slice(1)
    .filter((line) => line.includes("openai_client.mjs")).slice(0, 4);
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
    versions: { node: process.versions.node, openai: version("openai"), zod: version("zod") } };
  process.stdout.write(`${JSON.stringify(report)}\n`);
}

// After this module has finished evaluating, so that importing itself finds every case.
setImmediate(() => {
  main().catch((err) => {
    console.error(err);
    process.exit(1);
  });
});

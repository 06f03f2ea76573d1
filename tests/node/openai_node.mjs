// The official OpenAI Node SDK against a live gyre: what an application built
// on it does. Prints one JSON object of results for tests/test_openai_node.py.
//
//     node tests/node/openai_node.mjs <base url> <model> [api key]
import OpenAI from "openai";

const [baseURL, model, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: apiKey ?? "unused", maxRetries: 0 });
const messages = [{ role: "user", content: "Write one sentence about the sea." }];
const out = {};

// Chat, whole and streamed (greedy: the stream must spell the same text).
const whole = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens: 12 });
out.whole = { content: whole.choices[0].message.content, finish: whole.choices[0].finish_reason, usage: whole.usage };
const stream = await client.chat.completions.create({
  model, messages, temperature: 0, max_tokens: 12, stream: true, stream_options: { include_usage: true },
});
let text = "", chunks = 0, finish = null, usage = null;
for await (const chunk of stream) {
  chunks += 1;
  for (const c of chunk.choices) {
    text += c.delta?.content ?? "";
    finish = c.finish_reason ?? finish;
  }
  usage = chunk.usage ?? usage;
}
out.stream = { content: text, chunks, finish, usage };

// Tools: a named function, whole and streamed (arguments arrive in pieces).
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather forecast",
    parameters: {
      type: "object",
      properties: { city: { enum: ["Paris", "Oslo", "Lima"] }, days: { type: "integer", minimum: 1, maximum: 7 } },
      required: ["city", "days"],
      additionalProperties: false,
    },
  },
}];
const ask = [{ role: "user", content: "What is the weather in Paris?" }];
const toolChoice = { type: "function", function: { name: "get_weather" } };
const called = await client.chat.completions.create({
  model, messages: ask, tools, tool_choice: toolChoice, temperature: 0, max_tokens: 200,
});
out.tools = { finish: called.choices[0].finish_reason, calls: called.choices[0].message.tool_calls };
const toolStream = await client.chat.completions.create({
  model, messages: ask, tools, tool_choice: toolChoice, temperature: 0, max_tokens: 200, stream: true,
});
const pieces = {};
let toolFinish = null;
for await (const chunk of toolStream) {
  for (const c of chunk.choices) {
    for (const t of c.delta?.tool_calls ?? []) {
      const p = (pieces[t.index] ??= { id: "", name: "", arguments: "" });
      p.id += t.id ?? "";
      p.name += t.function?.name ?? "";
      p.arguments += t.function?.arguments ?? "";
    }
    toolFinish = c.finish_reason ?? toolFinish;
  }
}
out.toolStream = { finish: toolFinish, calls: Object.values(pieces) };

// A typed error: an unknown model.
try {
  await client.chat.completions.create({ model: "no-such-model", messages });
  out.error = null;
} catch (e) {
  out.error = { status: e.status, type: e.error?.type ?? e.type, code: e.code ?? e.error?.code, name: e.constructor.name };
}
console.log(JSON.stringify(out));

// The TypeScript client (clients/typescript, `gyre-client`) against a live
// gyre, as an application imports it (by package name, through its exports
// map). Prints one JSON object for tests/test_typescript_client.py.
//
//     node typescript_client.mjs <grpc|grpcweb> <base url> <check> [json args]
//
// Checks: generate, stream, abort, leave, unknown-model, info, auth.
import { Code, ConnectError } from "gyre-client";
import { createNodeClient } from "gyre-client/node";
import { createWebClient } from "gyre-client/web";

const [protocol, baseUrl, check, rawArgs] = process.argv.slice(2);
const args = JSON.parse(rawArgs ?? "{}");
const make = (options = {}) =>
  protocol === "grpc" ? createNodeClient(baseUrl, options) : createWebClient(baseUrl, options);
const client = make();

// JSON.stringify cannot write bigint (protobuf uint64 fields).
const plain = (v) => JSON.parse(JSON.stringify(v, (_, x) => (typeof x === "bigint" ? Number(x) : x)));

function errorOf(e) {
  if (!(e instanceof ConnectError)) return { notConnectError: String(e?.stack ?? e) };
  return { code: Code[e.code], rawMessage: e.rawMessage };
}

async function caught(promise) {
  try {
    return { ok: plain(await promise) };
  } catch (e) {
    return { error: errorOf(e) };
  }
}

// Waits (bounded) until the engine runs nothing, as GetStats reports it.
async function statsWhenIdle() {
  let st;
  for (let i = 0; i < 400; i++) {
    st = await client.stats(args.model);
    if (st.running === 0 && st.waiting === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  return plain(st);
}

const out = {};
switch (check) {
  case "generate": {
    out.completion = await client.generate(args.prompt, args.options);
    // The same prompt given as token ids (gyre echoes nothing else needed).
    if (args.ids) out.fromIds = await client.generate(args.ids, args.options);
    break;
  }
  case "stream": {
    const s = client.stream(args.prompt, args.options);
    out.pieces = [];
    for await (const p of s) out.pieces.push(p);
    out.completion = s.completion;
    break;
  }
  case "abort": {
    // Abort the signal after the first piece; the loop must end with Canceled.
    const ac = new AbortController();
    const s = client.stream(args.prompt, { ...args.options, signal: ac.signal });
    out.pieces = 0;
    try {
      for await (const p of s) {
        out.pieces += 1;
        out.firstIds = out.firstIds ?? p.tokenIds;
        if (out.pieces === 1) {
          out.runningBefore = (await client.stats(args.model)).running;
          ac.abort();
        }
      }
      out.ended = "normally";
    } catch (e) {
      out.ended = "error";
      out.error = errorOf(e);
    }
    out.completion = s.completion ?? null;
    out.stats = await statsWhenIdle();
    break;
  }
  case "leave": {
    // Leaving the loop early (break) cancels the call too.
    const s = client.stream(args.prompt, args.options);
    out.pieces = 0;
    for await (const p of s) {
      out.pieces += 1;
      out.runningBefore = (await client.stats(args.model)).running;
      break;
    }
    out.completion = s.completion ?? null;
    out.stats = await statsWhenIdle();
    break;
  }
  case "unknown-model": {
    out.generate = await caught(client.generate("Hi", { model: "no-such-model", maxTokens: 2 }));
    out.stats = await caught(client.stats("no-such-model"));
    out.health = await caught(client.health("no-such-model"));
    break;
  }
  case "info": {
    out.models = plain(await client.models());
    out.stats = plain(await client.stats());
    out.health = await client.health();
    out.healthModel = await client.health(args.model);
    break;
  }
  case "auth": {
    out.none = await caught(make().models());
    out.wrong = await caught(make({ apiKey: "wrong" + args.key }).models());
    const keyed = make({ apiKey: args.key });
    out.right = await caught(keyed.models());
    out.generate = await caught(keyed.generate("Hello", { maxTokens: 3, temperature: 0 }));
    out.health = await caught(make().health());
    break;
  }
  default:
    throw new Error(`unknown check ${check}`);
}
process.stdout.write(JSON.stringify(plain(out)));

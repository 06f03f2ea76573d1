// The TypeScript client's browser entry (`gyre-client/web`, gRPC-Web over
// fetch) in a web page, as an application imports it: by package name,
// bundled with esbuild by tests/test_typescript_browser.py, which loads
// typescript_client.html in headless Chromium and calls
// `window.gyreCheck(check, args)` for each check. Every result is also
// written into the page (a table), so its screenshot shows them.
//
// Checks: generate, stream, abort, unknown-model, auth, refused.
import { Code, ConnectError } from "gyre-client";
import { createWebClient } from "gyre-client/web";

// Playwright hands results over as JSON; bigint (uint64 fields) is not JSON.
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

const checks = {
  async generate(c, args) {
    return { completion: await c.generate(args.prompt, args.options) };
  },
  async stream(c, args) {
    const s = c.stream(args.prompt, args.options);
    const pieces = [];
    for await (const p of s) pieces.push(p);
    return { pieces, completion: s.completion };
  },
  // Aborts the stream's signal after `afterPieces` pieces; the loop must
  // end with Canceled. The caller watches the engine let the request go.
  async abort(c, args) {
    const ac = new AbortController();
    const s = c.stream(args.prompt, { ...args.options, signal: ac.signal });
    const out = { pieces: 0, tokens: 0 };
    try {
      for await (const p of s) {
        out.pieces += 1;
        out.tokens += p.tokenIds.length;
        if (out.pieces === args.afterPieces) {
          out.runningBefore = (await c.stats(args.model)).running;
          ac.abort();
        }
      }
      out.ended = "normally";
    } catch (e) {
      out.ended = "error";
      out.error = errorOf(e);
    }
    out.completion = s.completion ?? null;
    return out;
  },
  async "unknown-model"(c) {
    return {
      generate: await caught(c.generate("Hi", { model: "no-such-model", maxTokens: 2 })),
      stats: await caught(c.stats("no-such-model")),
    };
  },
  async auth(_, args) {
    const keyed = createWebClient(args.baseUrl, { apiKey: args.key });
    return {
      none: await caught(createWebClient(args.baseUrl).models()),
      wrong: await caught(createWebClient(args.baseUrl, { apiKey: "wrong" + args.key }).models()),
      right: await caught(keyed.models()),
      generate: await caught(keyed.generate("Hello", { maxTokens: 3, temperature: 0 })),
    };
  },
  // From an origin the server does not grant: the browser refuses the call.
  async refused(c, args) {
    return { models: await caught(c.models()), generate: await caught(c.generate(args.prompt, { maxTokens: 2 })) };
  },
};

function show(check, result) {
  const row = document.createElement("tr");
  for (const text of [check, JSON.stringify(result)]) {
    const cell = document.createElement("td");
    cell.textContent = text.length > 400 ? text.slice(0, 400) + "…" : text;
    row.append(cell);
  }
  document.getElementById("results").append(row);
}

window.gyreCheck = async (check, args) => {
  const client = createWebClient(args.baseUrl, { apiKey: args.apiKey });
  const result = plain(await checks[check](client, args));
  show(check, result);
  return result;
};
document.getElementById("origin").textContent = location.origin;

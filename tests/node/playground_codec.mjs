// The playground's gRPC-Web module (shim/src/playground/assets/grpcweb.js)
// in Node, for tests/test_playground.py: encodes the requests and decodes
// the messages and bodies the test gives it (made with the real protobuf
// classes), and, given a live gRPC port, makes calls through its Client.
//
//     node playground_codec.mjs <path of grpcweb as .mjs>  < input.json
//
// Prints one JSON object.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const web = await import(pathToFileURL(process.argv[2]).href);
const input = JSON.parse(readFileSync(0, "utf8"));

const hex = (b) => Buffer.from(b).toString("hex");
const bytes = (h) => new Uint8Array(Buffer.from(h, "hex"));
const schemas = {
  GenerateResponse: web.GENERATE_RESPONSE,
  EngineStats: web.ENGINE_STATS,
  ListModelsResponse: web.LIST_MODELS_RESPONSE,
};
const failure = (f) => {
  try {
    f();
    return null;
  } catch (e) {
    return e.message;
  }
};

const out = {};
out.requests = input.requests.map((r) => hex(web.encodeRequest(r)));
out.getStats = input.statsModels.map((m) => hex(web.encodeGetStats(m)));
out.decoded = input.decode.map(({ type, hex: h }) => web.decode(schemas[type], bytes(h)));
out.framed = hex(web.frame(bytes(input.frame)));

// One gRPC-Web body, fed to the frame parser in chunks of several sizes.
out.bodies = [];
const body = bytes(input.body);
for (const size of [1, 2, 3, 5, 7, 64, body.length]) {
  const parser = new web.FrameParser();
  const frames = [];
  for (let i = 0; i < body.length; i += size) {
    for (const f of parser.push(body.subarray(i, i + size))) {
      frames.push(f.trailers ? { trailers: Object.fromEntries(web.parseTrailers(f.data)) } : { data: hex(f.data) });
    }
  }
  out.bodies.push({ size, frames, pending: parser.pending() });
}
const cut = new web.FrameParser();
cut.push(body.subarray(0, body.length - 1));
out.cutPending = cut.pending();

out.malformed = input.malformed.map((h) => failure(() => web.decode(web.GENERATE_RESPONSE, bytes(h))));
out.badUint = failure(() => web.encodeRequest({ text: "x", maxTokens: -1 }));

if (input.live) {
  const client = new web.Client(input.live);
  const models = await client.listModels();
  const stats = await client.getStats("");
  let unknown = null;
  try {
    for await (const _ of client.generateStream({ model: "no-such-model", text: "hi" })) {
      // nothing arrives
    }
  } catch (e) {
    unknown = { name: e.name, code: e.code, codeName: e.codeName, message: e.grpcMessage };
  }
  const events = [];
  for await (const e of client.generateStream({ text: input.liveText, maxTokens: 4, temperature: 0 })) {
    events.push(e);
  }
  out.live = { models, stats, unknown, events };
}

process.stdout.write(JSON.stringify(out));

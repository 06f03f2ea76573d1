// gRPC-Web for gyre's playground: the transport (fetch, length-prefixed
// frames, trailers) and the protobuf wire format of the few gyre.v1 messages
// the page sends and reads (see proto/gyre/v1/generate.proto).
//
// Written by hand for the page, without generated code or a bundler, so the
// page is these few files as they are in the repository. Field numbers are
// checked against the real protobuf classes by tests/test_playground.py.
// Runs in browsers and in Node 20+ (the test drives it there too).

const utf8 = new TextEncoder();
const fromUtf8 = new TextDecoder();

// ---------------------------------------------------------------------------
// Protobuf wire format

const VARINT = 0;
const FIXED64 = 1;
const LENGTH_DELIMITED = 2;
const FIXED32 = 5;

/** Builds one message; fields are written in call order. */
export class Writer {
  constructor() {
    this.bytes = [];
  }

  /** A non-negative integer up to 2^53 as a varint. */
  varint(n) {
    if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`not a uint: ${n}`);
    while (n >= 0x80) {
      this.bytes.push((n % 0x80) | 0x80);
      n = Math.floor(n / 0x80);
    }
    this.bytes.push(n);
    return this;
  }

  tag(field, wireType) {
    return this.varint(field * 8 + wireType);
  }

  uint(field, n) {
    return this.tag(field, VARINT).varint(n);
  }

  bool(field, b) {
    return this.tag(field, VARINT).varint(b ? 1 : 0);
  }

  float(field, x) {
    const b = new Uint8Array(4);
    new DataView(b.buffer).setFloat32(0, x, true);
    this.tag(field, FIXED32);
    this.bytes.push(...b);
    return this;
  }

  raw(field, bytes) {
    this.tag(field, LENGTH_DELIMITED).varint(bytes.length);
    for (const b of bytes) this.bytes.push(b);
    return this;
  }

  string(field, s) {
    return this.raw(field, utf8.encode(s));
  }

  /** A sub-message: `build` fills a fresh Writer. */
  message(field, build) {
    const w = new Writer();
    build(w);
    return this.raw(field, w.finish());
  }

  finish() {
    return Uint8Array.from(this.bytes);
  }
}

/** Reads one message's fields. */
export class Reader {
  constructor(bytes) {
    this.b = bytes;
    this.pos = 0;
  }

  eof() {
    return this.pos >= this.b.length;
  }

  /** A varint as a Number (exact up to 2^53). */
  varint() {
    let n = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.b.length) throw new Error("protobuf: truncated varint");
      const byte = this.b[this.pos++];
      n += (byte & 0x7f) * scale;
      if (!(byte & 0x80)) return n;
      scale *= 0x80;
    }
    throw new Error("protobuf: varint longer than 10 bytes");
  }

  take(n) {
    if (this.pos + n > this.b.length) throw new Error("protobuf: truncated field");
    const out = this.b.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }

  lengthDelimited() {
    return this.take(this.varint());
  }

  skip(wireType) {
    switch (wireType) {
      case VARINT: this.varint(); break;
      case FIXED64: this.take(8); break;
      case LENGTH_DELIMITED: this.lengthDelimited(); break;
      case FIXED32: this.take(4); break;
      default: throw new Error(`protobuf: unsupported wire type ${wireType}`);
    }
  }
}

// A schema maps field numbers to [name, type, repeated?]; a type is "string",
// "uint" (any unsigned varint), "bool", "float" or a nested schema. Fields
// not in the schema are skipped, as protobuf readers do.
function defaults(schema) {
  const out = {};
  for (const [name, type, repeated] of Object.values(schema)) {
    if (repeated) out[name] = [];
    else if (type === "string") out[name] = "";
    else if (type === "uint" || type === "float") out[name] = 0;
    else if (type === "bool") out[name] = false;
    // Sub-messages stay undefined when absent (their presence is meaningful).
  }
  return out;
}

function wireTypeOf(type) {
  if (type === "uint" || type === "bool") return VARINT;
  if (type === "float") return FIXED32;
  return LENGTH_DELIMITED; // strings and sub-messages
}

function scalar(r, type, wireType) {
  if (wireType !== wireTypeOf(type)) {
    throw new Error(`protobuf: wire type ${wireType} where ${typeof type === "string" ? type : "a message"} was expected`);
  }
  switch (type) {
    case "string":
      return fromUtf8.decode(r.lengthDelimited());
    case "uint":
      return r.varint();
    case "bool":
      return r.varint() !== 0;
    case "float": {
      const b = r.take(4);
      return new DataView(b.buffer, b.byteOffset, 4).getFloat32(0, true);
    }
    default:
      return decode(type, r.lengthDelimited());
  }
}

/** Decodes `bytes` as the message `schema` describes, into a plain object. */
export function decode(schema, bytes) {
  const r = new Reader(bytes);
  const out = defaults(schema);
  while (!r.eof()) {
    const key = r.varint();
    const field = Math.floor(key / 8);
    const wireType = key % 8;
    const spec = schema[field];
    if (!spec) {
      r.skip(wireType);
      continue;
    }
    const [name, type, repeated] = spec;
    if (repeated && type === "uint" && wireType === LENGTH_DELIMITED) {
      // Packed: the varints of several values in one length-delimited field.
      const packed = new Reader(r.lengthDelimited());
      while (!packed.eof()) out[name].push(packed.varint());
    } else if (repeated) {
      out[name].push(scalar(r, type, wireType));
    } else {
      out[name] = scalar(r, type, wireType);
    }
  }
  return out;
}

// gyre.v1 messages (the fields the page uses).
const USAGE = { 1: ["promptTokens", "uint"], 2: ["completionTokens", "uint"], 3: ["cachedTokens", "uint"] };
const REQUEST_ERROR = { 1: ["code", "uint"], 2: ["message", "string"], 3: ["reason", "string"], 4: ["field", "string"] };
const DELTA = { 1: ["text", "string"], 2: ["tokenIds", "uint", true], 40: ["reasoning", "string"] };
const FINISH = { 1: ["reason", "uint"], 2: ["usage", USAGE], 3: ["matchedStop", "string"], 5: ["error", REQUEST_ERROR] };
export const GENERATE_RESPONSE = {
  1: ["requestId", "string"], 2: ["delta", DELTA], 3: ["finish", FINISH], 4: ["index", "uint"],
};
const MODEL = {
  1: ["id", "string"], 2: ["ownedBy", "string"], 4: ["maxModelLen", "uint"], 6: ["architecture", "string"],
  7: ["aliases", "string", true], 11: ["kind", "string"], 12: ["chat", "bool"],
};
export const LIST_MODELS_RESPONSE = { 1: ["models", MODEL, true] };
export const ENGINE_STATS = {
  1: ["model", "string"], 2: ["waiting", "uint"], 3: ["running", "uint"], 4: ["blockSize", "uint"],
  5: ["kvBlocksTotal", "uint"], 6: ["kvBlocksUsed", "uint"], 7: ["kvBlocksCached", "uint"],
  8: ["prefixQueryTokensTotal", "uint"], 9: ["prefixHitTokensTotal", "uint"], 10: ["lastStepTokens", "uint"],
  11: ["stepsTotal", "uint"], 12: ["preemptionsTotal", "uint"], 13: ["generatedTokensTotal", "uint"],
};

/** `FinishReason` values by number. */
export const FINISH_REASONS = ["unspecified", "stop", "length", "cancelled", "error", "tool_calls"];

/**
 * gyre.v1.Request: `messages` ([{role, content}], chat input) or `text`;
 * `model`, `maxTokens`, `temperature` and `ignoreEos` when given.
 */
export function encodeRequest({ model, messages, text, maxTokens, temperature, ignoreEos }) {
  const w = new Writer();
  if (model) w.string(2, model);
  if (messages) {
    w.message(5, (chat) => {
      for (const m of messages) chat.message(1, (msg) => msg.string(1, m.role).string(2, m.content));
    });
  } else {
    w.string(3, text ?? "");
  }
  if (temperature !== undefined && temperature !== null) w.message(6, (s) => s.float(1, temperature));
  if (maxTokens !== undefined && maxTokens !== null) w.uint(7, maxTokens);
  if (ignoreEos) w.bool(10, true);
  return w.finish();
}

/** gyre.v1.GetStatsRequest. */
export function encodeGetStats(model) {
  const w = new Writer();
  if (model) w.string(1, model);
  return w.finish();
}

// ---------------------------------------------------------------------------
// gRPC-Web framing

/** A message as a gRPC-Web data frame: flag 0, 4-byte big-endian length, bytes. */
export function frame(message) {
  const out = new Uint8Array(5 + message.length);
  new DataView(out.buffer).setUint32(1, message.length, false);
  out.set(message, 5);
  return out;
}

/** Splits a response body, arriving in chunks of any size, into frames. */
export class FrameParser {
  constructor() {
    this.buf = new Uint8Array(0);
  }

  /** The frames completed by `chunk`: [{trailers: bool, data: Uint8Array}]. */
  push(chunk) {
    const joined = new Uint8Array(this.buf.length + chunk.length);
    joined.set(this.buf);
    joined.set(chunk, this.buf.length);
    let rest = joined;
    const frames = [];
    while (rest.length >= 5) {
      const flags = rest[0];
      const length = new DataView(rest.buffer, rest.byteOffset + 1, 4).getUint32(0, false);
      if (rest.length < 5 + length) break;
      if (flags & 0x01) throw new GrpcError(13, "gRPC-Web: compressed frames are not supported");
      frames.push({ trailers: (flags & 0x80) !== 0, data: rest.slice(5, 5 + length) });
      rest = rest.subarray(5 + length);
    }
    this.buf = rest.slice();
    return frames;
  }

  /** Bytes of an unfinished frame are held. */
  pending() {
    return this.buf.length > 0;
  }
}

/** A trailers frame's text ("name: value" lines) as a Map of lower-cased names. */
export function parseTrailers(bytes) {
  const out = new Map();
  for (const line of fromUtf8.decode(bytes).split("\r\n")) {
    const colon = line.indexOf(":");
    if (colon > 0) out.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
  }
  return out;
}

/** gRPC status codes by number. */
export const CODES = [
  "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
  "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
];

/** A call that ended with a gRPC status other than OK. */
export class GrpcError extends Error {
  constructor(code, message) {
    const name = CODES[code] ?? `code ${code}`;
    super(message ? `${name}: ${message}` : name);
    this.name = "GrpcError";
    this.code = code;
    this.codeName = name;
    this.grpcMessage = message ?? "";
  }
}

function grpcMessage(raw) {
  if (!raw) return "";
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

// The gRPC code for an HTTP status without a grpc-status (per the gRPC
// spec's HTTP to gRPC status mapping).
function codeForHttp(status) {
  return { 400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14 }[status] ?? 2;
}

/** A client of one gyre gRPC port over gRPC-Web. */
export class Client {
  /** `baseUrl`: "http(s)://host:port"; `apiKey`: sent as `authorization: Bearer <key>`. */
  constructor(baseUrl, { apiKey = "", fetch: fetchImpl } = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.fetch = fetchImpl ?? globalThis.fetch.bind(globalThis);
  }

  headers() {
    const h = {
      "content-type": "application/grpc-web+proto",
      accept: "application/grpc-web+proto",
      "x-grpc-web": "1",
      "x-user-agent": "gyre-playground",
    };
    if (this.apiKey) h.authorization = `Bearer ${this.apiKey}`;
    return h;
  }

  /**
   * Calls `method` ("gyre.v1.Generation/GetStats") with the encoded
   * `request`; yields each response message's bytes; throws GrpcError for a
   * status other than OK. Aborting `signal` ends the call (the fetch rejects
   * with an AbortError, and the server sees the connection go).
   */
  async *call(method, request, signal) {
    const response = await this.fetch(`${this.baseUrl}/${method}`, {
      method: "POST",
      headers: this.headers(),
      body: frame(request),
      signal,
    });
    const headerStatus = response.headers.get("grpc-status");
    if (response.status !== 200) {
      if (headerStatus !== null) {
        throw new GrpcError(Number(headerStatus), grpcMessage(response.headers.get("grpc-message")));
      }
      throw new GrpcError(codeForHttp(response.status), `HTTP ${response.status}`);
    }
    // A trailers-only answer (an error before any message) has its status in the headers.
    if (headerStatus !== null && headerStatus !== "0") {
      throw new GrpcError(Number(headerStatus), grpcMessage(response.headers.get("grpc-message")));
    }
    const reader = response.body.getReader();
    const parser = new FrameParser();
    let trailers = null;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        for (const f of parser.push(value)) {
          if (f.trailers) trailers = parseTrailers(f.data);
          else yield f.data;
        }
      }
    } finally {
      // Leaving early (a consumer's `break`) lets go of the connection.
      reader.cancel().catch(() => {});
    }
    if (parser.pending()) throw new GrpcError(13, "gRPC-Web: the response ended inside a frame");
    const status = trailers?.get("grpc-status") ?? headerStatus;
    if (status === null || status === undefined) {
      throw new GrpcError(13, "gRPC-Web: the response ended without a grpc-status");
    }
    if (status !== "0") {
      throw new GrpcError(Number(status), grpcMessage(trailers?.get("grpc-message")));
    }
  }

  async unary(method, request, schema, signal) {
    let last;
    for await (const message of this.call(method, request, signal)) last = message;
    if (last === undefined) throw new GrpcError(13, `${method}: no response message`);
    return decode(schema, last);
  }

  /** gyre.v1.Generation/ListModels: [{id, kind, chat, maxModelLen, ...}]. */
  async listModels(signal) {
    const r = await this.unary("gyre.v1.Generation/ListModels", new Uint8Array(0), LIST_MODELS_RESPONSE, signal);
    return r.models;
  }

  /** gyre.v1.Generation/GetStats for `model` (empty: the default model). */
  getStats(model, signal) {
    return this.unary("gyre.v1.Generation/GetStats", encodeGetStats(model), ENGINE_STATS, signal);
  }

  /** gyre.v1.Generation/GenerateStream: yields each GenerateResponse as an object. */
  async *generateStream(request, signal) {
    for await (const message of this.call("gyre.v1.Generation/GenerateStream", encodeRequest(request), signal)) {
      yield decode(GENERATE_RESPONSE, message);
    }
  }
}

// The typed helper layer over the generated gyre.v1 client: transport-neutral
// (node.ts and web.ts pick the transport). Everything generated stays
// reachable: `GyreClient.generation` is the raw Connect client of
// gyre.v1.Generation, and the message types are re-exported from index.ts.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import type { CallOptions, Client, Interceptor, Transport } from "@connectrpc/connect";

import { Health, HealthCheckResponse_ServingStatus } from "./gen/grpc/health/v1/health_pb.js";
import {
  FinishReason,
  Generation,
  RequestSchema,
  SamplingParamsSchema,
} from "./gen/gyre/v1/generate_pb.js";
import type { EngineStats, Finish, Model, Request } from "./gen/gyre/v1/generate_pb.js";

/** Options shared by every helper call. */
export interface CallSettings {
  /** Cancels the call (a stream ends with a ConnectError of code Canceled). */
  signal?: AbortSignal;
  /** Deadline of the whole call, sent as `grpc-timeout`. */
  timeoutMs?: number;
}

/** A generation request in a few common fields (the rest: `extra`). */
export interface GenerateOptions extends CallSettings {
  /** Model id or alias; unset: the server's default model. */
  model?: string;
  maxTokens?: number;
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: number | bigint;
  stop?: string[];
  ignoreEos?: boolean;
  /** Any other gyre.v1.Request field, merged last. */
  extra?: Partial<Omit<Request, "$typeName">>;
}

export interface Usage {
  promptTokens: number;
  completionTokens: number;
  cachedTokens: number;
}

/** A finished generation. */
export interface Completion {
  text: string;
  tokenIds: number[];
  /** "stop", "length", "cancelled", "error" or "tool_calls". */
  finishReason: string;
  /** The stop string that ended it, if one did. */
  matchedStop?: string;
  usage: Usage;
  requestId: string;
  /** The id of the model that served it (the `gyre-model` response header). */
  model: string;
}

/** One piece of a streamed generation. */
export interface Piece {
  text: string;
  tokenIds: number[];
}

/** What `stream` returns: iterate it for pieces; `completion` is set once it ends. */
export interface GenerationStream extends AsyncIterable<Piece> {
  readonly completion: Completion | undefined;
}

/** The prompt: text, or token ids used verbatim. */
export type Prompt = string | readonly number[];

export interface ClientOptions {
  /** Sent as `authorization: Bearer <apiKey>` on every call. */
  apiKey?: string;
  /** More Connect interceptors, run after the API-key one. */
  interceptors?: Interceptor[];
}

/** An interceptor adding `authorization: Bearer <key>` to each request. */
export function apiKeyInterceptor(apiKey: string): Interceptor {
  return (next) => async (req) => {
    req.header.set("authorization", `Bearer ${apiKey}`);
    return next(req);
  };
}

/** The interceptors a client built from `options` uses. */
export function interceptorsFor(options: ClientOptions = {}): Interceptor[] {
  return [...(options.apiKey ? [apiKeyInterceptor(options.apiKey)] : []), ...(options.interceptors ?? [])];
}

const FINISH_NAMES: Record<number, string> = {
  [FinishReason.STOP]: "stop",
  [FinishReason.LENGTH]: "length",
  [FinishReason.CANCELLED]: "cancelled",
  [FinishReason.ERROR]: "error",
  [FinishReason.TOOL_CALLS]: "tool_calls",
};

function buildRequest(prompt: Prompt, o: GenerateOptions): Request {
  const sampling = create(SamplingParamsSchema, {
    temperature: o.temperature,
    topP: o.topP,
    topK: o.topK,
    seed: o.seed === undefined ? undefined : BigInt(o.seed),
  });
  return create(RequestSchema, {
    model: o.model ?? "",
    input: typeof prompt === "string"
      ? { case: "text", value: prompt }
      : { case: "tokenIds", value: { ids: [...prompt] } },
    sampling,
    maxTokens: o.maxTokens,
    stop: o.stop ?? [],
    ignoreEos: o.ignoreEos ?? false,
    ...o.extra,
  });
}

function callOptions(o: CallSettings, onHeader?: (h: Headers) => void): CallOptions {
  return { signal: o.signal, timeoutMs: o.timeoutMs, onHeader };
}

/** A request's `Finish` with reason ERROR, as the ConnectError it describes. */
function finishError(finish: Finish): ConnectError {
  const e = finish.error;
  const code = e && e.code in Code ? (e.code as Code) : Code.Unknown;
  return new ConnectError(e?.message || "generation failed", code);
}

/** gyre's gRPC API in a few typed calls, over any Connect transport. */
export class GyreClient {
  /** The generated client of gyre.v1.Generation, for everything else. */
  readonly generation: Client<typeof Generation>;
  /** The generated client of grpc.health.v1.Health. */
  readonly healthService: Client<typeof Health>;

  constructor(readonly transport: Transport) {
    this.generation = createClient(Generation, transport);
    this.healthService = createClient(Health, transport);
  }

  /** Generates to the end and returns the whole completion. */
  async generate(prompt: Prompt, options: GenerateOptions = {}): Promise<Completion> {
    const s = this.stream(prompt, options);
    for await (const _ of s) {
      // drained: the completion gathers every piece
    }
    return s.completion!;
  }

  /**
   * Streams a generation (gyre.v1.Generation/GenerateStream) as pieces of
   * text with their token ids. Abort `options.signal` or leave the loop early
   * to cancel it; the server then lets the generation go.
   */
  stream(prompt: Prompt, options: GenerateOptions = {}): GenerationStream {
    const request = buildRequest(prompt, options);
    const generation = this.generation;
    const state: { completion: Completion | undefined } = { completion: undefined };

    async function* events(signal: AbortSignal): AsyncGenerator<Piece> {
      let model = "";
      let text = "";
      const tokenIds: number[] = [];
      const onHeader = (h: Headers) => {
        model = h.get("gyre-model") ?? model;
      };
      const call = generation.generateStream(request, { ...callOptions(options, onHeader), signal });
      for await (const ev of call) {
        if (ev.event.case === "delta") {
          const d = ev.event.value;
          text += d.text;
          tokenIds.push(...d.tokenIds);
          yield { text: d.text, tokenIds: [...d.tokenIds] };
        } else if (ev.event.case === "finish") {
          const f = ev.event.value;
          if (f.reason === FinishReason.ERROR) throw finishError(f);
          state.completion = {
            text,
            tokenIds,
            finishReason: FINISH_NAMES[f.reason] ?? "unspecified",
            matchedStop: f.matchedStop,
            usage: {
              promptTokens: f.usage?.promptTokens ?? 0,
              completionTokens: f.usage?.completionTokens ?? 0,
              cachedTokens: f.usage?.cachedTokens ?? 0,
            },
            requestId: ev.requestId,
            model,
          };
        }
      }
      if (!state.completion) throw new ConnectError("the stream ended without a finish", Code.Internal);
    }

    async function* pieces(): AsyncGenerator<Piece> {
      // A signal of our own, aborted by the caller's and when the loop is left
      // early: Connect does not cancel a call whose iterator is only returned.
      const ac = new AbortController();
      const abort = () => ac.abort(options.signal?.reason);
      if (options.signal?.aborted) abort();
      options.signal?.addEventListener("abort", abort);
      try {
        yield* events(ac.signal);
      } finally {
        options.signal?.removeEventListener("abort", abort);
        if (!state.completion) ac.abort();
      }
    }

    const iterable = pieces();
    return {
      [Symbol.asyncIterator]: () => iterable,
      get completion() {
        return state.completion;
      },
    };
  }

  /** The models this server hosts (gyre.v1.Generation/ListModels). */
  async models(options: CallSettings = {}): Promise<Model[]> {
    return (await this.generation.listModels({}, callOptions(options))).models;
  }

  /** The engine's live counters (gyre.v1.Generation/GetStats); `model` unset: the default model. */
  async stats(model?: string, options: CallSettings = {}): Promise<EngineStats> {
    return this.generation.getStats({ model: model ?? "" }, callOptions(options));
  }

  /**
   * grpc.health.v1 Check: "SERVING", "NOT_SERVING", ... for the server
   * (""), a service name, or a model id. An unknown name is a ConnectError
   * with code NotFound.
   */
  async health(service = "", options: CallSettings = {}): Promise<string> {
    const res = await this.healthService.check({ service }, callOptions(options));
    return HealthCheckResponse_ServingStatus[res.status] ?? String(res.status);
  }
}

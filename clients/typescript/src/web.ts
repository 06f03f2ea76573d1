// The browser: gRPC-Web (@connectrpc/connect-web) over fetch, to gyre's gRPC
// port (tonic-web serves gRPC-Web there over HTTP/1.1). Works wherever a
// global fetch streams response bodies: browsers, Node 20+, Deno, Bun.
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import type { GrpcWebTransportOptions } from "@connectrpc/connect-web";

import { GyreClient, interceptorsFor } from "./client.js";
import type { ClientOptions } from "./client.js";

export * from "./index.js";

export interface WebClientOptions extends ClientOptions {
  /** Anything else for the transport (a custom fetch, timeouts, ...). */
  transport?: Partial<GrpcWebTransportOptions>;
}

/** A client for gyre's gRPC port over gRPC-Web; `baseUrl` is "http(s)://host:port". */
export function createWebClient(baseUrl: string, options: WebClientOptions = {}): GyreClient {
  const transport = createGrpcWebTransport({
    useBinaryFormat: true,
    ...options.transport,
    baseUrl,
    interceptors: [...interceptorsFor(options), ...(options.transport?.interceptors ?? [])],
  });
  return new GyreClient(transport);
}

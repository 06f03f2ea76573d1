// Node: gRPC over HTTP/2 (@connectrpc/connect-node), to gyre's gRPC port.
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { GrpcTransportOptions } from "@connectrpc/connect-node";

import { GyreClient, interceptorsFor } from "./client.js";
import type { ClientOptions } from "./client.js";

export * from "./index.js";

export interface NodeClientOptions extends ClientOptions {
  /** Anything else for the transport (TLS via nodeOptions, timeouts, ...). */
  transport?: Partial<GrpcTransportOptions>;
}

/**
 * A client for gyre's gRPC port from Node. `baseUrl` is "http://host:port"
 * (plaintext, HTTP/2 with prior knowledge) or "https://host:port".
 */
export function createNodeClient(baseUrl: string, options: NodeClientOptions = {}): GyreClient {
  const transport = createGrpcTransport({
    ...options.transport,
    baseUrl,
    interceptors: [...interceptorsFor(options), ...(options.transport?.interceptors ?? [])],
  });
  return new GyreClient(transport);
}

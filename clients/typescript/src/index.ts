// gyre-client: the transport-neutral part. Import createNodeClient from
// "gyre-client/node" or createWebClient from "gyre-client/web".
export { GyreClient, apiKeyInterceptor, interceptorsFor } from "./client.js";
export type {
  CallSettings,
  ClientOptions,
  Completion,
  GenerateOptions,
  GenerationStream,
  Piece,
  Prompt,
  Usage,
} from "./client.js";
export { Code, ConnectError } from "@connectrpc/connect";
export * from "./gen/gyre/v1/generate_pb.js";
export { Health, HealthCheckResponse_ServingStatus } from "./gen/grpc/health/v1/health_pb.js";

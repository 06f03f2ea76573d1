"""A gyre gRPC client in a few lines: two requests multiplexed on one
bidirectional `Generate` stream, the second cancelled after its first token.

    python clients/python/generate.py
    python clients/python/example.py 127.0.0.1:50051
"""
import queue
import sys

import grpc

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gyre.v1 import generate_pb2 as pb  # noqa: E402
from gyre.v1 import generate_pb2_grpc as pb_grpc  # noqa: E402


def main(addr: str) -> None:
    stub = pb_grpc.GenerationStub(grpc.insecure_channel(addr))
    outbox: "queue.Queue[pb.GenerateRequest | None]" = queue.Queue()

    def requests():
        while (msg := outbox.get()) is not None:
            yield msg

    outbox.put(pb.GenerateRequest(start=pb.Request(
        request_id="a", text="The capital of France is", max_tokens=16,
        sampling=pb.SamplingParams(temperature=0.0))))
    outbox.put(pb.GenerateRequest(start=pb.Request(
        request_id="b", chat=pb.ChatInput(messages=[pb.ChatMessage(role="user", content="Hi!")]),
        max_tokens=200, ignore_eos=True)))
    texts = {"a": "", "b": ""}
    open_requests = {"a", "b"}
    for ev in stub.Generate(requests()):
        if ev.HasField("delta"):
            texts[ev.request_id] += ev.delta.text
            if ev.request_id == "b" and texts["b"]:
                outbox.put(pb.GenerateRequest(cancel=pb.Cancel(request_id="b")))
        elif ev.HasField("rejected"):
            # A start whose id was empty or still running: nothing started
            # (the running request of that id is unaffected).
            print(f"{ev.request_id!r} rejected: {ev.rejected.error.message}")
        elif ev.HasField("finish"):
            f = ev.finish
            print(f"{ev.request_id}: {pb.FinishReason.Name(f.reason)} "
                  f"({f.usage.completion_tokens} tokens) {texts[ev.request_id]!r}")
            open_requests.discard(ev.request_id)
            if not open_requests:
                outbox.put(None)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051")

"""Reproduce the Triton 2.51 crash on gRPC streams ended by an error status.

Starts a private stack, then opens streams one after another, each sending a chat with empty
text (refused with INVALID_ARG) and closing it, either at once or after a pause. With
`--grpc-error-header` the stream carries `triton_grpc_error: true`, so the server ends it with
an error status: the path that crashes 2.51. Without it (what the SDK does) the error arrives
as a message and the client closes the stream. Stops at the first server crash.

    python scripts/error-stream-stress.py --grpc-error-header --pause-ms 0   # crashed after 466..2202
    python scripts/error-stream-stress.py --grpc-error-header --pause-ms 20  # no crash in 7000
    python scripts/error-stream-stress.py --streams 10000                    # the SDK's mode
    python scripts/error-stream-stress.py --cancel-mid-stream                # cancel after the first token
"""

from __future__ import annotations

import argparse
import queue
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tqdm import tqdm

from switchboard import paths
from switchboard.ops.launch import Ports, Stack


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=3000, help="streams to open (default 3000)")
    p.add_argument("--pause-ms", type=float, default=0.0, help="pause between the error and closing the stream")
    p.add_argument(
        "--grpc-error-header",
        action="store_true",
        help="open streams with `triton_grpc_error: true` (errors end the stream with a status)",
    )
    p.add_argument(
        "--cancel-mid-stream",
        action="store_true",
        help="send a valid chat instead and cancel the stream after its first response",
    )
    p.add_argument("--run-dir", default=str(paths.BUILD / "stress"), help="logs of the private stack")
    args = p.parse_args()
    stack = Stack(Ports.free(), run_dir=Path(args.run_dir))
    stack.start()
    text = grpcclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.asarray([[b"Tell me about returns." if args.cancel_mid_stream else b""]], np.object_))
    headers = {"triton_grpc_error": "true"} if args.grpc_error_header else None
    crashed_at = hung_at = None
    try:
        for i in tqdm(range(args.streams), desc="streams", unit="stream"):
            got: queue.Queue = queue.Queue()
            c = grpcclient.InferenceServerClient(stack.grpc_url)
            c.start_stream(callback=lambda result, error, q=got: q.put(error), headers=headers)
            c.async_stream_infer("chat", [text])
            try:
                got.get(timeout=30)
            except queue.Empty:
                hung_at = i + 1
                break
            time.sleep(args.pause_ms / 1000)
            c.stop_stream(cancel_requests=args.cancel_mid_stream)
            c.close()
            if stack.triton.poll() is not None:
                crashed_at = i + 1
                break
    finally:
        stack.stop()
    if crashed_at:
        print(f"tritonserver died after {crashed_at} streams (log: {stack.triton_log})")
        return 1
    if hung_at:
        print(f"stream {hung_at} got no response within 30 s (log: {stack.triton_log})")
        return 1
    what = "cancelled after the first response" if args.cancel_mid_stream else "ended by an error"
    mode = "with" if args.grpc_error_header else "without"
    print(f"no crash in {args.streams} streams {what}, {mode} the error header, closed after {args.pause_ms:g} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

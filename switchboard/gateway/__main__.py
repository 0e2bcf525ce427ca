"""``python -m switchboard.gateway``: serve the OpenAI-compatible API and the web chat."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from switchboard.common import tracing
from switchboard.gateway.keys import ENV, TIERS, KeysError, KeyTable


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m switchboard.gateway",
        description="OpenAI-compatible HTTP API (POST /v1/chat/completions, with text or the caller's audio; "
        "POST /v1/audio/transcriptions; GET /v1/models, /healthz, /readyz) and a web chat page (/) with a "
        "microphone, in front of Switchboard's chat, voice_chat and asr models, which it reaches over gRPC.",
    )
    p.add_argument("--host", default=os.environ.get("GATEWAY_HOST", "127.0.0.1"), help="address to listen on")
    p.add_argument("--port", type=int, default=int(os.environ.get("GATEWAY_PORT", 8080)), help="default 8080")
    p.add_argument(
        "--grpc-url",
        default=f"127.0.0.1:{os.environ.get('GRPC_PORT', 8001)}",
        help="Switchboard's gRPC endpoint (default 127.0.0.1:$GRPC_PORT or :8001)",
    )
    p.add_argument("--model-name", default="switchboard", help="the model id clients send (default switchboard)")
    p.add_argument(
        "--keys-file",
        type=Path,
        default=os.environ.get("SWITCHBOARD_API_KEYS_FILE") or None,
        help=f"API keys, one '<key> <tier>' a line (tiers: {', '.join(TIERS)}); also ${ENV}='<key>:<tier>,...'. "
        "None at all: the gateway is open (every caller gets --open-tier)",
    )
    p.add_argument("--open-tier", choices=sorted(TIERS), default="standard", help="tier of callers without keys")
    p.add_argument(
        "--cors-origins",
        default=os.environ.get("GATEWAY_CORS_ORIGINS", ""),
        help="comma-separated origins allowed to call the API from a browser (default: none; '*' for any)",
    )
    p.add_argument(
        "--transcription-model",
        default="switchboard-asr",
        help="the model id transcriptions send (default switchboard-asr; whisper-1 is accepted too)",
    )
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest chat body without audio (1 MiB)")
    p.add_argument(
        "--max-audio-bytes",
        type=int,
        default=25 << 20,
        help="largest audio file, uploaded or in a chat (default 25 MiB, as OpenAI's); beyond: 413",
    )
    p.add_argument(
        "--voice-retry-after-s",
        type=int,
        default=30,
        help="Retry-After of the 503 answered while the speech model is not loaded yet (default 30)",
    )
    p.add_argument("--max-inflight", type=int, default=256, help="chats at once through the gateway; beyond: 429")
    p.add_argument("--retry-after-s", type=int, default=1, help="Retry-After of 429 and 503 answers (default 1)")
    p.add_argument("--timeout-s", type=float, default=120.0, help="wait for chat's next response (default 120)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="log every request (default: quiet)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        keys = KeyTable.load(args.keys_file, open_tier=args.open_tier)
    except KeysError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 2
    try:
        trace_settings = tracing.TraceSettings.from_env("gateway")
    except ValueError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 2
    if keys.open:
        logging.getLogger("switchboard.gateway").warning(
            "no API keys (--keys-file, $%s): the API is open to anyone who can reach :%d", ENV, args.port
        )
    import uvicorn

    from switchboard.gateway.app import GatewayConfig, create_app
    from switchboard.gateway.server import HTTP_PROTOCOL

    config = GatewayConfig(
        grpc_url=args.grpc_url,
        model=args.model_name,
        keys=keys,
        cors_origins=tuple(o.strip() for o in args.cors_origins.split(",") if o.strip()),
        max_body_bytes=args.max_body_bytes,
        transcription_model=args.transcription_model,
        max_audio_bytes=args.max_audio_bytes,
        voice_retry_after_s=args.voice_retry_after_s,
        max_inflight=args.max_inflight,
        retry_after_s=args.retry_after_s,
        timeout_s=args.timeout_s,
    )
    tracing.configure(trace_settings, edge=True)  # the edge: sampling is decided here
    uvicorn.run(
        create_app(config),
        host=args.host,
        port=args.port,
        http=HTTP_PROTOCOL,
        log_level=args.log_level,
        access_log=args.access_log,
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    tracing.active().shutdown()  # what is queued goes out (bounded by the export timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""switchboard-chat: talk to a running Switchboard from the terminal.

One-shot:     switchboard-chat "How do I return a damaged item?"
Spoken:       switchboard-chat --audio question.wav   (WAV, FLAC, OGG...: prints what was heard,
              then streams the answer; --language zh for Mandarin)
Interactive:  switchboard-chat            (one session for the whole conversation)
As JSON:      switchboard-chat --json-schema order.schema.json "Where is my order SB123456?"
              (--json: any JSON object; an answer that ends parses, and matches the schema)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path

from switchboard.client import ChatClient, ChatError, ChatStats, Heard, TokenLogprobs


def _stats_line(stats: ChatStats) -> str:
    ttft = f"{stats.ttft_ms:.0f} ms" if stats.ttft_ms is not None else "-"
    extra = " fallback" if stats.fallback else ""
    if stats.asr:
        asr_ms = stats.asr.get("asr_ms")
        extra += f", heard {stats.asr.get('audio_s') or 0:.1f} s of audio in {asr_ms or 0:.0f} ms"
    return (
        f"[{stats.route} pool, prompt {stats.prompt_tokens} tokens, reused {stats.reused_tokens}, "
        f"generated {stats.generated_tokens}, first token {ttft}{extra}]"
    )


def ask(client: ChatClient, text: str, args, session_id: str | None) -> int:
    try:
        for event in client.chat(
            text,
            session_id=session_id,
            priority=args.priority,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            response_format=args.response_format,
            logprobs=args.logprobs,
        ):
            if isinstance(event, ChatStats):
                print()
                if args.stats:
                    print(_stats_line(event), file=sys.stderr)
            elif isinstance(event, TokenLogprobs):
                for e in event.entries:
                    alts = ", ".join(f"{t['token']!r} {t['logprob']:.2f}" for t in e["top_logprobs"])
                    print(
                        f"\n  [{e['token']!r} {e['logprob']:.2f}{'; ' + alts if alts else ''}]", end="", file=sys.stderr
                    )
            else:
                print(event, end="", flush=True)
    except ChatError as e:
        print(f"\nerror ({e.code}): {e}", file=sys.stderr)
        return 2
    return 0


def ask_aloud(client: ChatClient, path: Path, args, session_id: str | None) -> int:
    """A spoken question: what the recognizer heard, then the answer as it streams."""
    try:
        audio = path.read_bytes()
    except OSError as e:
        print(f"error: cannot read {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        for event in client.voice_chat(
            audio,
            session_id=session_id,
            priority=args.priority,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            language=args.language,
        ):
            if isinstance(event, Heard):
                if not event.transcript.strip():
                    print(f"no speech heard in {path}", file=sys.stderr)
                    return 1
                print(f"heard: {event.transcript}", flush=True)
            elif isinstance(event, ChatStats):
                print()
                if args.stats:
                    print(_stats_line(event), file=sys.stderr)
            else:
                print(event, end="", flush=True)
    except ChatError as e:
        print(f"\nerror ({e.code}): {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="switchboard-chat",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("text", nargs="?", help="message to send; omit for an interactive session")
    p.add_argument(
        "--audio",
        type=Path,
        metavar="FILE",
        help="ask with a recording instead of text (WAV, FLAC, OGG...): the transcript, then the answer",
    )
    p.add_argument("--language", help="the recording's language (en, zh; default: the recognizer detects it)")
    p.add_argument(
        "--url",
        default=os.environ.get("SWITCHBOARD_URL", f"127.0.0.1:{os.environ.get('GRPC_PORT', 8001)}"),
        help="Triton gRPC address (default: %(default)s)",
    )
    p.add_argument("--session", help="session id (interactive default: a new random id)")
    p.add_argument("--priority", type=int, choices=[1, 2], default=2, help="1 = live/VIP, 2 = default")
    p.add_argument("--max-new-tokens", type=int, help="answer length limit")
    p.add_argument("--temperature", type=float, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, help="nucleus sampling threshold")
    p.add_argument("--stats", action=argparse.BooleanOptionalAction, default=True, help="print stats after each answer")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="the answer is a JSON object")
    fmt.add_argument("--json-schema", type=Path, metavar="FILE", help="the answer is JSON valid against this schema")
    p.add_argument(
        "--logprobs",
        type=int,
        choices=range(6),
        metavar="N",
        help="print each token's log-probability and N alternatives",
    )
    args = p.parse_args(argv)
    args.response_format = None
    if args.json:
        args.response_format = {"type": "json_object"}
    elif args.json_schema is not None:
        try:
            args.response_format = {"type": "json_schema", "schema": json.loads(args.json_schema.read_text())}
        except (OSError, ValueError) as e:
            p.error(f"--json-schema {args.json_schema}: {e}")
    client = ChatClient(args.url)
    if args.audio is not None:
        if args.text is not None:
            p.error("give a message or --audio, not both")
        return ask_aloud(client, args.audio, args, args.session)
    if args.language is not None:
        p.error("--language goes with --audio")
    if args.text is not None:
        return ask(client, args.text, args, args.session)
    session = args.session or f"cli-{uuid.uuid4().hex[:12]}"
    print(f"Switchboard at {args.url}, session {session}. Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            text = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if text.strip():
            print("bot> ", end="", flush=True)
            ask(client, text, args, session)


if __name__ == "__main__":
    sys.exit(main())

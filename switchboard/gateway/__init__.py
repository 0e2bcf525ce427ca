"""OpenAI-compatible HTTP API and web chat in front of ``chat``, ``voice_chat`` and ``asr``
(``python -m switchboard.gateway``): ``app`` (the routes), ``routes`` (their handlers),
``audio`` (transcriptions, and the voice channel's errors), ``checks`` (what every route checks
first), ``uploads`` (multipart bodies, in memory, with limits), ``streaming`` (an answer, whole
or as server-sent events), ``server`` (uvicorn's protocol: HTTP/1.0 answers close-delimited),
``openai_request`` (OpenAI's request checked, as one chat call), ``openai_response``
(chat's answer as OpenAI's responses and chunks), ``keys`` (API keys and their
priority tiers), ``errors`` (OpenAI's error shape), ``state`` (what the handlers share),
``static/`` (the web page, its microphone). docs/gateway.md says how to use it."""

from switchboard.gateway.app import GatewayConfig, create_app

__all__ = ["GatewayConfig", "create_app"]

"""The serving pipeline, without Triton: one chat turn (request, prompt, session and its KV,
route, engine stream, FAQ fallback) and the admission that orders chats by priority."""

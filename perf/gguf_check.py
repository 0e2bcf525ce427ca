"""A GGUF import against llama.cpp on the same file: ``python -m perf.gguf_check``.

The import (switchboard/export/gguf.py) rebuilds the tokenizer from the file's vocabulary and
dequantizes the weights through transformers. llama.cpp is the file's own reader, so it is the
reference for both:

- **tokens**: every corpus text (FAQ questions, held-out paraphrases, answers; English and
  Chinese) through llama-server's ``/tokenize`` and through the imported tokenizer as the engine
  reads it: the count that are identical, and the first that are not;
- **logits**: held-out texts, teacher-forced: at every position, llama.cpp's greedy next token
  (``/completion``, one token, temperature 0, its prompt cache reusing the prefix) against the
  argmax of the imported checkpoint's logits in PyTorch (FP32). llama.cpp computes with the
  quantized weights as stored (Q4_K, Q5_0, ... dot products on 8-bit activations), the import
  with their FP32 dequantization, so agreement is high but not total; it is the figure.

llama.cpp is built on first use (about 10 minutes on 2 cores; ``perf.llamacpp``),
which is why this is a benchmark-side check and not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from switchboard import paths


def tokens(server, checkpoint: Path, texts: list[str]) -> dict:
    from switchboard.artifact.tokenizer import TextTokenizer

    ours = TextTokenizer(checkpoint)
    differ = []
    for text in texts:
        theirs = server.post("/tokenize", {"content": text, "add_special": False})["tokens"]
        mine = ours.encode(text)
        if theirs != mine:
            differ.append({"text": text, "llama.cpp": theirs[:24], "import": mine[:24]})
    return {"texts": len(texts), "identical": len(texts) - len(differ), "differ": differ[:10]}


def top1(server, checkpoint: Path, texts: list[str], bos: int | None) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from switchboard.artifact.tokenizer import TextTokenizer
    from switchboard.engine import heads

    tok = TextTokenizer(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    heads.restrict(model, checkpoint)
    same = total = 0
    for text in texts:
        ids = ([bos] if bos is not None else []) + tok.encode(text)
        with torch.no_grad():
            ours = model(torch.tensor([ids])).logits[0].argmax(-1).tolist()
        for p in range(1, len(ids)):
            out = server.post(
                "/completion",
                {"prompt": ids[:p], "n_predict": 1, "temperature": 0, "cache_prompt": True, "return_tokens": True},
            )
            theirs = out.get("tokens") or []
            total += 1
            same += bool(theirs) and theirs[0] == ours[p - 1]
    return {"positions": total, "top1_agree": same, "rate": same / total if total else 0.0}


def main(argv: list[str] | None = None) -> int:
    from perf import llamacpp
    from switchboard.data import corpus
    from switchboard.export import gguf
    from switchboard.ops.launch import free_port

    p = argparse.ArgumentParser(prog="python -m perf.gguf_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", type=Path, default=paths.BUILD / "gguf" / "gemma-3-270m-q4_k_m.gguf")
    p.add_argument("--texts", type=int, default=60, help="held-out texts teacher-forced for the logits check")
    p.add_argument("--out", type=Path, default=paths.BUILD / "bench" / "gguf-check.json")
    args = p.parse_args(argv)
    if not args.gguf.is_file():
        p.error(f"--gguf {args.gguf}: no such file (make model-gemma assembles the default one)")
    checkpoint = gguf.ensure(args.gguf)
    data = corpus.load()
    texts = llamacpp.corpus_texts()
    heldout = [q for e in data.faq for q in e.heldout][: args.texts]
    info = json.loads((checkpoint / "generation_config.json").read_text())
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    bos = info.get("bos_token_id") if config.get("add_bos_token", True) else None
    t0 = time.monotonic()
    log = llamacpp.ROOT / "gguf-check.log"
    server = llamacpp.LlamaServer(args.gguf, free_port(), llamacpp.Settings(parallel=1), log).wait()
    try:
        report = {
            "gguf": str(args.gguf),
            "checkpoint": str(checkpoint),
            "tokens": tokens(server, checkpoint, texts),
            "logits": top1(server, checkpoint, heldout, bos),
        }
    finally:
        server.stop()
    report["seconds"] = round(time.monotonic() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n")
    t, lg = report["tokens"], report["logits"]
    print(f"tokens: {t['identical']} of {t['texts']} corpus texts identical to llama.cpp's")
    print(f"logits: top-1 agrees at {lg['top1_agree']} of {lg['positions']} positions ({lg['rate']:.3f})")
    print(f"report: {args.out}")
    return 0 if t["identical"] == t["texts"] else 1


if __name__ == "__main__":
    sys.exit(main())

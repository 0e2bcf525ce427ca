"""A Qwen2.5-0.5B-shaped checkpoint with random weights (speed measurements only; nothing is
downloaded): python scripts/qwen2-0.5b-shape.py OUT_DIR, then export it with
python -m switchboard.export --model OUT_DIR --out build/artifacts/qwen2-0.5b-random \\
    --precision fp32,int8-dynamic --no-gate --bench-batches 1,8,32 --bench-repeats 2"""

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

out = Path(sys.argv[1])
config = Qwen2Config(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config)
model.save_pretrained(out)
# The default model's tokenizer supplies prompts; its ids are all inside Qwen2's vocabulary.
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy(Path("build/default-model") / f, out / f)
print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")

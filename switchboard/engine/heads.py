"""An output head restricted to the tokens a fine-tuned model was trained to write.

A fine-tune that trains the softmax over a slice of a large vocabulary (Gemma 3: 262,144
tokens; the agent's answers use about 17k of them, ``switchboard.training.gemma``) never
pushes the other tokens' logits down, so they must not compete at serving time either. The
checkpoint lists the slice in ``output_vocabulary.json``; the exported graph and ``runtime:
torch`` then compute logits for those rows of the (tied) embedding only, and every other token
gets the lowest finite logit. The interface does not change (logits stay [B, 1, V]), so the
engine, its sampling and the grammars are the same; a grammar that allows only tokens outside
the slice still gets one (they lose to nothing, they are not -inf). At Gemma 3 270M this is
also most of a decode step: the full head is 168M multiply-adds per token, the slice 11M.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FILE = "output_vocabulary.json"


def read(checkpoint: Path) -> list[int] | None:
    """The checkpoint's output vocabulary (sorted token ids), or None when it has none."""
    path = Path(checkpoint) / FILE
    if not path.is_file():
        return None
    ids = json.loads(path.read_text())
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise ValueError(f"{path}: expected a non-empty list of token ids")
    return sorted(set(ids))


class SlicedHead(torch.nn.Module):
    """``hidden @ weight[ids].T`` scattered into a [.., vocab] row of the lowest finite logit."""

    def __init__(self, weight: torch.Tensor, ids: list[int], vocab_size: int):
        super().__init__()
        if max(ids) >= vocab_size:
            raise ValueError(f"output vocabulary has id {max(ids)}, the model only {vocab_size}")
        index = torch.tensor(ids, dtype=torch.long)
        self.register_buffer("index", index)
        self.register_buffer("weight", weight.detach()[index].clone())  # a copy of rows, not a parameter
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.matmul(hidden, self.weight.t())
        low = torch.finfo(logits.dtype).min
        out = torch.full((*hidden.shape[:-1], self.vocab_size), low, dtype=logits.dtype, device=logits.device)
        return out.scatter(-1, self.index.expand(*hidden.shape[:-1], -1), logits)


def restrict(model, checkpoint: Path) -> list[int] | None:
    """Give ``model`` the checkpoint's restricted head, if it lists one; the ids, or None."""
    ids = read(checkpoint)
    if ids is not None:
        model.lm_head = SlicedHead(model.get_output_embeddings().weight, ids, model.config.vocab_size)
    return ids

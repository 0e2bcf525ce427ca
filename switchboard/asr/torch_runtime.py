"""The recognizer's graphs run in PyTorch: the ASR pool on a GPU where ONNX Runtime has no CUDA.

``TorchWhisper`` is the same runtime as ``runtime.OnnxWhisper`` (``encode``, ``empty_past``,
``decode``; what ``model.AsrModel`` needs) over the very modules the ONNX graphs are exported
from (``graphs.py``), so the two cannot drift apart: the export's parity check holds those
modules to transformers' Whisper, and tests/export/test_asr_export.py and
tests/integration/test_asr_torch_runtime.py hold this runtime to the ONNX graphs.

Attention goes through PyTorch's fused kernels, flash and memory-efficient only: cuDNN's builds
a plan for every new shape, and decoding makes one per step (the cache grows by a position).

The caches stay on the device between steps as torch tensors (``model.GrowingCache`` slices
them as it slices NumPy arrays). On the fixed-size buffers (``static``, ``graphs``) the next
tokens are chosen on the device and only they come back to the host ([B] ids, not a step's
[B, V] logits: 51,865 columns in Whisper's vocabulary); decoding growing, the logits come back
and ``AsrModel`` chooses there. On CUDA the weights run in
float16 unless ``dtype`` says otherwise; on the CPU in float32.

How a batch's decoding steps run (``steps``):

- ``graphs`` (the default on CUDA): every step of a batch of B rows is one replayed CUDA graph,
  captured once per B. A step of whisper-small is some 300 kernels; launched one by one from
  Python, a batch of 6 cost 3 times a batch of 1 where the GPU's arithmetic says about the same
  (docs/benchmarks.md). A graph needs every tensor at the same address at every step, so the
  cache is one fixed-size buffer per layer ([max_batch, H, max_target_positions, hd]) written
  in place at each row's position, its later positions masked; the encoder's keys and values
  are copied into buffers of the encoder's full length (a shorter row's rest masked). Rows that
  finish are moved out of the leading rows (``keep``) and the batch replays the smaller
  graph; rows waiting may take their places (``StaticSteps.join``: in-flight batching, each
  row at its own position, a joining row's prompt fed a token a step in the batch's graph
  steps, so a batch does not run on half empty until its longest row ends).
  A batch holds its buffers until its last row ends; batches decoding at once (workers) each
  get a set. A prompt (several tokens at once) runs outside the graphs, on the same buffers.
- ``static``: the same buffers and modules without the graphs (what the graphs replay; the CPU
  tests hold it to ``growing``).
- ``growing`` (the default on the CPU): the cache grows by a position each step
  (``model.GrowingCache``).

With graphs, a fixed window's encoder (pretrained Whisper's 30 s) is replayed as a CUDA graph
per batch size too (and per window, with windows fitted to the audio), one batch at a time, its
outputs copied out of the graph's buffers (``encoder_graphs``; the GPU bench's ``--steps
graphs-eager`` turns it off to measure it). An encoder of variable length (the embedded
default's) launches its kernels one by one.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np

from switchboard.asr.runtime import KV, AsrManifest
from switchboard.runtime.choice import STEPS


class TorchWhisper:
    def __init__(
        self,
        model,
        manifest: AsrManifest,
        device: str = "cuda",
        dtype: str | None = None,
        fused: bool = True,
        steps: str = "auto",
        max_batch: int = 8,
    ):
        """``model``: a transformers ``WhisperForConditionalGeneration``; ``dtype``: float32,
        float16 or bfloat16 (default: float16 on CUDA, float32 elsewhere); ``fused``: attention
        through ``scaled_dot_product_attention`` (else the exported graphs' plain products);
        ``steps``: graphs, static or growing (see the module docstring; auto: graphs on CUDA,
        growing elsewhere); ``max_batch``: the most rows the fixed-size buffers hold (a larger
        batch decodes growing)."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from switchboard.asr.graphs import modules
        from switchboard.runtime import pytorch  # torch only where it is chosen

        self.manifest = manifest
        self.device = pytorch.device(device)
        self.dtype = pytorch.dtype(dtype, self.device)
        self._pytorch = pytorch
        if steps not in STEPS:
            raise ValueError(f"steps {steps!r}: expected {', '.join(STEPS)}")
        if steps == "auto":
            steps = "graphs" if self.device.type == "cuda" else "growing"
        if steps == "graphs" and self.device.type != "cuda":
            raise ValueError(f"steps 'graphs' needs a CUDA device, not {device!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch {max_batch}: expected at least 1")
        self.steps_mode, self.max_batch = steps, max_batch
        model = model.to(device=self.device, dtype=self.dtype).eval()
        encoder_graph, decoder_graph, static_graph = modules(fused=fused)
        self.encoder, self.decoder = encoder_graph(model).eval(), decoder_graph(model).eval()
        self.static = static_graph(model).eval()
        self._torch = torch
        backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        self._kernels = functools.partial(sdpa_kernel, backends)
        self._free: list[_Buffers] = []  # buffer sets no batch holds
        self._lock = threading.Lock()
        self._capturing = threading.Lock()  # one capture at a time
        self.choose_on_device = True  # False: each step's logits to the host (to measure against)
        # with graphs, a fixed window's encoder is a CUDA graph per batch size too (False: to measure)
        self.encoder_graphs = True
        # a step may run this many times its live rows (places rows left) before they move up;
        # None: 2 with graphs, where a few more rows cost next to nothing, else 1
        self.slack: float | None = None
        self._encoders: dict[tuple, tuple] = {}  # (batch size, frames) -> (graph, its input, its outputs)
        self._encoder_out: list = []  # every encoder graph's outputs, at the front of these
        self._encoder_pool = None  # every encoder graph's working memory
        self._banned: dict[bytes, object] = {}  # token ids never chosen, on the device

    @classmethod
    def load(cls, checkpoint: Path, manifest: AsrManifest, device: str = "cuda", dtype: str | None = None, **kw):
        from transformers import WhisperForConditionalGeneration

        return cls(WhisperForConditionalGeneration.from_pretrained(checkpoint), manifest, device, dtype, **kw)

    def encode(self, features: np.ndarray) -> KV:
        torch = self._torch
        x = torch.from_numpy(np.ascontiguousarray(features))
        with torch.inference_mode(), self._kernels():
            if self._encoder_replays(x.shape):
                out = self._encode_replayed(x)
            else:
                out = self.encoder(x.to(self.device, self.dtype))
        n = self.manifest.num_layers
        return list(zip(out[:n], out[n:]))

    def _encoder_replays(self, shape) -> bool:
        return (
            self.encoder_graphs
            and self.steps_mode == "graphs"
            and shape[-1] in self.manifest.windows
            and shape[0] <= self.max_batch
        )

    def _encode_replayed(self, x):
        """The encoder by the CUDA graph captured for ``len(x)`` rows and its window (captured
        here the first time, as ``_replay`` captures a step). One batch at a time encodes, and
        its outputs are copied out before the next may, so every encoder graph writes into one
        set of output buffers, sized for the largest, and takes its working memory from one
        pool: a graph per (batch size, window) costs the memory of one."""
        torch, key = self._torch, (x.shape[0], x.shape[-1])
        with self._capturing:
            entry = self._encoders.get(key)
            if entry is None:
                inputs = torch.zeros(x.shape, device=self.device, dtype=self.dtype)
                if self._encoder_pool is None:
                    m = self.manifest
                    size = self.max_batch * m.num_heads * m.head_dim * m.max_source_positions
                    self._encoder_out = [
                        torch.empty(size, device=self.device, dtype=self.dtype) for _ in range(2 * m.num_layers)
                    ]
                    self._encoder_pool = torch.cuda.graph_pool_handle()
                graph, outputs = self._capture(lambda: self._shared(self.encoder(inputs)), pool=self._encoder_pool)
                entry = self._encoders[key] = (graph, inputs, outputs)
            graph, inputs, outputs = entry
            inputs.copy_(x)  # from the host, cast to the model's dtype
            graph.replay()
            return [t.clone() for t in outputs]

    def _shared(self, outputs) -> list:
        """``outputs`` copied to the front of the encoder graphs' output buffers: the copies."""
        copies = []
        for buffer, t in zip(self._encoder_out, outputs, strict=True):
            if t.numel() > buffer.numel():
                raise ValueError(f"encoder output {tuple(t.shape)} larger than its buffer ({buffer.numel()} values)")
            copies.append(buffer[: t.numel()].view(t.shape).copy_(t))
        return copies

    def empty_past(self, batch: int) -> KV:
        m = self.manifest
        shape = (batch, m.num_heads, 0, m.head_dim)
        zeros = self._torch.zeros
        return [
            (zeros(shape, device=self.device, dtype=self.dtype), zeros(shape, device=self.device, dtype=self.dtype))
            for _ in range(m.num_layers)
        ]

    def decode(self, input_ids: np.ndarray, past: KV, cross: KV) -> tuple[np.ndarray, KV]:
        torch = self._torch
        ids = torch.from_numpy(np.asarray(input_ids, np.int64)).to(self.device)
        with torch.inference_mode(), self._kernels():
            out = self.decoder(ids, *(t for kv in past for t in kv), *(t for kv in cross for t in kv))
        return out[0].float().cpu().numpy(), list(zip(out[1::2], out[2::2]))

    def _on_device(self, ids: np.ndarray):
        key = ids.tobytes()
        if key not in self._banned:
            self._banned[key] = self._torch.from_numpy(ids).to(self.device)
        return self._banned[key]

    def steps(self, cross: KV, batch: int) -> StaticSteps | None:
        """A batch's decoding on fixed-size buffers (``model.AsrModel`` asks); None: decode
        growing (``steps`` growing, or more rows than ``max_batch``)."""
        if self.steps_mode == "growing" or batch > self.max_batch:
            return None
        with self._lock:
            buffers = self._free.pop() if self._free else None
        if buffers is None:
            buffers = _Buffers(self)
        return (StaticSteps if self.choose_on_device else _ChosenOnHost)(self, buffers, cross, batch)

    def warm(self, sets: int = 1) -> int:
        """Make ``sets`` buffer sets and, with graphs, capture every batch size's graph on each
        (at load, so no caller waits for a capture; one set per batch decoding at once). Returns
        the graphs captured."""
        if self.steps_mode == "growing":
            return 0
        with self._lock:  # the sets taken out while their graphs are captured, as a batch takes one
            held, self._free = self._free, []
        held += [_Buffers(self) for _ in range(max(0, sets - len(held)))]
        captured = 0
        if self.steps_mode == "graphs":
            torch = self._torch
            with torch.inference_mode(), self._kernels():
                for buffers in held:
                    for batch in range(1, self.max_batch + 1):
                        if batch not in buffers.graphs:
                            self._replay(buffers, batch)  # on zeros, at position 0
                            captured += 1
                for window in self.manifest.windows if self.encoder_graphs else ():
                    for batch in range(1, self.max_batch + 1):
                        if (batch, window) not in self._encoders:
                            self._encode_replayed(torch.zeros((batch, self.manifest.n_mels, window)))
                            captured += 1
                torch.cuda.synchronize(self.device)
        for buffers in held:
            self._release(buffers)
        return captured

    def _release(self, buffers: _Buffers) -> None:
        with self._lock:
            self._free.append(buffers)

    def _run_static(self, buffers: _Buffers, rows: slice, input_ids, positions):
        return self.static(input_ids, positions, *buffers.views(rows))

    def _replay(self, buffers: _Buffers, batch: int):
        """Step ``batch`` rows by the graph captured for that many (captured here the first
        time; the warm-up runs write the step's keys and values at the step's position, the same
        values the replay writes again)."""
        entry = buffers.graphs.get(batch)
        if entry is None:
            with self._capturing:
                entry = buffers.graphs[batch] = self._capture(
                    lambda: self._run_static(buffers, slice(0, batch), buffers.ids[:batch], buffers.positions[:batch])
                )
        graph, logits = entry
        graph.replay()
        return logits

    def _capture(self, run, pool=None):
        """``run`` as a CUDA graph (switchboard/runtime/pytorch.py); the caller holds ``_capturing``."""
        return self._pytorch.capture(run, self.device, pool)


class _Buffers:
    """One batch's fixed-size caches on the device, for up to ``max_batch`` rows, and the CUDA
    graphs captured over them (by batch size)."""

    def __init__(self, runtime: TorchWhisper):
        torch, m = runtime._torch, runtime.manifest
        b, heads, hd = runtime.max_batch, m.num_heads, m.head_dim
        length, frames = m.max_target_positions, m.max_source_positions

        def zeros(*shape):
            return torch.zeros(shape, device=runtime.device, dtype=runtime.dtype)

        with torch.inference_mode():
            n = m.num_layers
            self.self_keys = [zeros(b, heads, length, hd) for _ in range(n)]
            self.self_values = [zeros(b, heads, length, hd) for _ in range(n)]
            self.cross_keys = [zeros(b, heads, hd, frames) for _ in range(n)]
            self.cross_values = [zeros(b, heads, frames, hd) for _ in range(n)]
            # A model whose every input is its whole window fills the encoder's length; others
            # (any length, or windows fitted to the audio) mask the rest.
            whole = m.window_frames is not None and not m.fitted_windows
            self.cross_mask = None if whole else zeros(b, 1, 1, frames)
            # A graph step's input, one host-to-device copy: each row's token, then its position.
            self.io = torch.zeros((b, 2), device=runtime.device, dtype=torch.int64)
            self.ids, self.positions = self.io[:, :1], self.io[:, 1:]
        self.graphs: dict = {}

    def views(self, rows: slice) -> tuple:
        """The static decoder's cache arguments for ``rows``."""
        return (
            [k[rows] for k in self.self_keys],
            [v[rows] for v in self.self_values],
            [k[rows] for k in self.cross_keys],
            [v[rows] for v in self.cross_values],
            None if self.cross_mask is None else self.cross_mask[rows],
        )

    def every(self) -> list:
        tensors = self.self_keys + self.self_values + self.cross_keys + self.cross_values
        return tensors + ([self.cross_mask] if self.cross_mask is not None else [])


class StaticSteps:
    """One batch decoding on a ``_Buffers`` set (``model.Steps``); gives the set back at close.

    Rows may join while the batch decodes (``join``, in-flight batching): a joining row's
    encoder output goes into free places of the buffers, and it steps with the others, each
    row at its own position (``AsrModel`` feeds its prompt a token a step; a language to
    detect is detected on those rows alone, ``rows``).

    A row that ends leaves its place empty rather than the rows after it moving up: moving
    every cache tensor's rows is a kernel per tensor, each time a row ends, which at in-flight
    batching's pace cost more than the steps. A step runs over the places up to the last one
    taken, empty ones included (on a GPU a few more rows of a step cost next to nothing),
    and rows that join fill the empty places first. The rows move up only when more than
    ``slack`` times the live rows would run (``TorchWhisper.slack``)."""

    def __init__(self, runtime: TorchWhisper, buffers: _Buffers, cross: KV, batch: int):
        self.runtime, self.buffers = runtime, buffers
        self.slots: list[int] = []  # each row's place in the buffers, in the rows' order
        self.slack = runtime.slack or (2.0 if runtime.steps_mode == "graphs" else 1.0)
        self.positions = np.zeros(runtime.max_batch, np.int64)  # each place's next position
        self._io = np.zeros((runtime.max_batch, 2), np.int64)  # a graph step's input, host side
        self.join(cross)
        if self.batch != batch:
            raise ValueError(f"{self.batch} rows of encoder output for a batch of {batch}")

    @property
    def batch(self) -> int:
        return len(self.slots)

    def room(self) -> int:
        """How many more rows may join."""
        return self.runtime.max_batch - self.batch

    def join(self, cross: KV) -> int:
        """The rows of ``cross`` (the encoder's keys and values) join after the current rows,
        in the first free places; returns the first of their row indices, each at position 0."""
        torch, buffers = self.runtime._torch, self.buffers
        first, count = self.batch, cross[0][0].shape[0]
        if count > self.room():
            raise ValueError(f"{count} rows joining a batch with room for {self.room()}")
        taken = set(self.slots)
        places = [p for p in range(self.runtime.max_batch) if p not in taken][:count]
        frames = cross[0][0].shape[-1]
        with torch.inference_mode():
            for source, rows in _runs(places):
                # The rows' last cache is zeroed rather than only masked: a value that overflowed
                # there must not reach this batch's softmax (0 * inf).
                for t in buffers.self_keys + buffers.self_values:
                    t[rows].zero_()
                for (k, v), keys, values in zip(cross, buffers.cross_keys, buffers.cross_values):
                    keys[rows, :, :, :frames].copy_(k[source])
                    values[rows, :, :frames].copy_(v[source])
                    if frames < keys.shape[-1]:
                        keys[rows, :, :, frames:].zero_()
                        values[rows, :, frames:].zero_()
                if buffers.cross_mask is not None:
                    buffers.cross_mask[rows].zero_()
                    buffers.cross_mask[rows, :, :, frames:] = torch.finfo(self.runtime.dtype).min
        self.positions[places] = 0
        self.slots += places
        return first

    def rows(self, first: int, count: int) -> _Rows:
        """Steps on rows ``first`` .. ``first + count - 1`` alone (joining rows whose language
        is detected before their prompt)."""
        return _Rows(self, slice(first, first + count))

    def step(self, input_ids: np.ndarray, rows: slice | None = None) -> np.ndarray:
        logits, order = self._step(input_ids, rows)
        with self.runtime._torch.inference_mode():
            out = logits.float().cpu().numpy()
        return out if order is None else out[order]

    def choose(
        self,
        input_ids: np.ndarray,
        banned: np.ndarray,
        rows: slice | None = None,
        first: np.ndarray | None = None,
        first_banned: np.ndarray | None = None,
    ) -> np.ndarray:
        """One step, then ``model.greedy`` on the device: [B] tokens come back to the host, not
        [B, V] logits. ``first``: rows also banned ``first_banned`` (their first token)."""
        rt, torch = self.runtime, self.runtime._torch
        logits, order = self._step(input_ids, rows)
        with torch.inference_mode():
            if banned.size:  # out of place: a graph's logits are its own buffer
                logits = logits.index_fill(1, rt._on_device(banned), float("-inf"))
            if first is not None and first.size and first_banned is not None and first_banned.size:
                if not banned.size:
                    logits = logits.clone()
                which = torch.from_numpy(first if order is None else order[first]).to(rt.device)
                logits[which.unsqueeze(1), rt._on_device(first_banned).unsqueeze(0)] = float("-inf")
            tokens = logits.argmax(dim=1).cpu().numpy()
        return tokens if order is None else tokens[order]

    def _step(self, input_ids: np.ndarray, rows: slice | None):
        """Feed the tokens of ``rows`` (None: every row). Returns the last position's logits of
        every place the step ran, [places, V] on the device, and which of those are the rows',
        in their order (None: all, in order)."""
        rt, buffers, torch = self.runtime, self.buffers, self.runtime._torch
        whole = rows is None
        if whole and self._span() > self.slack * self.batch:
            self._compact()
        places = np.asarray(self.slots if whole else self.slots[rows], np.int64)
        if not whole and len(places) and places.max() - places.min() + 1 != len(places):
            self._compact()  # a run of its own needs its rows side by side
            places = np.asarray(self.slots[rows], np.int64)
        ids = np.asarray(input_ids, np.int64)
        width = ids.shape[1]
        if len(places) != ids.shape[0]:
            raise ValueError(f"{ids.shape[0]} rows of tokens for {len(places)} rows")
        at = self.positions[places]
        if at.max(initial=0) + width > buffers.self_keys[0].shape[2]:  # on the GPU: a device-side assert
            raise ValueError(f"decoding past the decoder's {buffers.self_keys[0].shape[2]} positions")
        start = 0 if whole else int(places.min(initial=0))
        span = slice(start, self._span() if whole else start + len(places))
        order = places - start
        count = span.stop - span.start
        if np.array_equal(order, np.arange(count)):
            order, fed, fed_at = None, ids, at
        else:  # empty places run too, on token 0 at position 0: what they compute is never read
            fed, fed_at = np.zeros((count, width), np.int64), np.zeros(count, np.int64)
            fed[order], fed_at[order] = ids, at
        with torch.inference_mode(), rt._kernels():
            if whole and width == 1 and rt.steps_mode == "graphs":
                io = self._io[:count]
                io[:, 0], io[:, 1] = fed[:, 0], fed_at
                buffers.io[:count].copy_(torch.from_numpy(io))
                logits = rt._replay(buffers, count)
            else:
                positions = torch.from_numpy(fed_at[:, None] + np.arange(width)).to(rt.device)
                logits = rt._run_static(buffers, span, torch.from_numpy(fed).to(rt.device), positions)
        self.positions[places] += width
        return logits, order

    def _span(self) -> int:
        """How many places a step over every row runs: up to the last one taken."""
        return max(self.slots) + 1 if self.slots else 0

    def _compact(self) -> None:
        """Move the rows up to the first places, in their order."""
        torch, places = self.runtime._torch, self.slots
        if places != list(range(len(places))):
            which = torch.tensor(places, device=self.runtime.device)
            with torch.inference_mode():
                for t in self.buffers.every():
                    t[: len(places)] = t.index_select(0, which)
            self.positions[: len(places)] = self.positions[places]
        self.slots = list(range(len(places)))

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` go on, in that order; the others' places are free."""
        self.slots = [self.slots[j] for j in rows]

    def close(self) -> None:
        if self.buffers is not None:
            self.runtime._release(self.buffers)
            self.buffers = None


def _runs(places: list[int]):
    """``places`` (ascending) as runs of consecutive ones: (the runs' slice of ``places``, the
    places' slice)."""
    start = 0
    for i in range(1, len(places) + 1):
        if i == len(places) or places[i] != places[i - 1] + 1:
            yield slice(start, i), slice(places[start], places[i - 1] + 1)
            start = i


class _Rows:
    """Some consecutive rows of a ``StaticSteps`` batch stepped alone (``model.Steps``' step
    and choose; the rows joined the batch and their prompt runs)."""

    def __init__(self, steps: StaticSteps, rows: slice):
        self.steps, self.which = steps, rows
        if getattr(steps, "choose", None) is None:
            self.choose = None

    def step(self, input_ids: np.ndarray) -> np.ndarray:
        return self.steps.step(input_ids, self.which)

    def choose(self, input_ids: np.ndarray, banned: np.ndarray) -> np.ndarray:
        return self.steps.choose(input_ids, banned, self.which)


class _ChosenOnHost(StaticSteps):
    """``choose_on_device`` False: each step's logits go to the host and ``AsrModel`` chooses."""

    choose = None

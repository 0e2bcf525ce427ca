"""The LitServe ASR peer's API (see ``perf.asr_peers``): seed 002's Whisper behind
LitServe's request batching, on transformers' ``WhisperForConditionalGeneration``. LitServe
pickles the API into its worker process, so it lives at module level in a module of its own."""

from __future__ import annotations

from pathlib import Path

import litserve as ls
from fastapi import HTTPException


class WhisperAPI(ls.LitAPI):
    def __init__(self, checkpoint: Path, threads: int, max_new_tokens: int | None, **kwargs):
        super().__init__(**kwargs)
        self.checkpoint, self.threads, self.max_new_tokens = Path(checkpoint), threads, max_new_tokens

    def setup(self, device):
        import torch
        from tokenizers import Tokenizer
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

        from perf.asr_load import multilingual, window_seconds
        from switchboard.asr.checkpoint import hop_length

        if self.threads:
            torch.set_num_threads(self.threads)
        self.torch = torch
        self.model = WhisperForConditionalGeneration.from_pretrained(self.checkpoint).eval()
        # Stock transformers takes only the model's whole window: every input is padded to it.
        self.features = WhisperFeatureExtractor(
            feature_size=self.model.config.num_mel_bins,
            hop_length=hop_length(self.checkpoint),
            chunk_length=int(window_seconds(self.checkpoint)),
        )
        self.tokenizer = Tokenizer.from_file(str(self.checkpoint / "tokenizer.json"))
        self.multilingual = multilingual(self.checkpoint)

    def decode_request(self, request):
        """(samples, language); audio that does not decode fails here, alone, before batching."""
        from perf.asr_load import decode_audio

        upload = request.get("content") if hasattr(request, "get") else None
        if upload is None or not hasattr(upload, "file"):
            raise HTTPException(400, "expected a multipart upload with the audio file in field 'content'")
        try:
            samples = decode_audio(upload.file.read())
        except Exception as e:  # noqa: BLE001 - any decoding failure is the caller's file
            raise HTTPException(400, f"not audio this peer can decode: {e}") from None
        language = request.get("language") or None
        return samples, language

    def batch(self, inputs):
        return list(inputs)

    def predict(self, batch):
        audio = [samples for samples, _ in batch]
        features = self.features(audio, sampling_rate=16_000, return_tensors="pt").input_features
        kwargs = {"do_sample": False, "num_beams": 1}
        if self.max_new_tokens:
            kwargs["max_new_tokens"] = self.max_new_tokens
        if self.multilingual:
            kwargs |= {"language": [lang or "en" for _, lang in batch], "task": "transcribe"}
        with self.torch.inference_mode():
            ids = self.model.generate(features, **kwargs)
        return [self.tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in ids]

    def unbatch(self, output):
        return list(output)

    def encode_response(self, text):
        return {"text": text}

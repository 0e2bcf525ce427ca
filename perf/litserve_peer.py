"""The LitServe peer (see ``perf.peers``): LitServe's batched streaming loop around
Hugging Face ``generate``. LitServe pickles the API into its worker process, so it lives at
module level here."""

from __future__ import annotations

import litserve as ls
from fastapi import HTTPException

from perf.peer_model import PeerModel, json_line
from switchboard.serving.prompt import PromptTooLong


class ChatAPI(ls.LitAPI):
    def __init__(self, checkpoint, artifacts, device: str, threads: int, **kwargs):
        super().__init__(**kwargs)
        self.checkpoint, self.artifacts, self.torch_device, self.threads = checkpoint, artifacts, device, threads

    def setup(self, device):
        self.model = PeerModel(self.checkpoint, self.artifacts, self.torch_device, self.threads)

    def decode_request(self, request):
        try:
            return self.model.job(request)
        except (ValueError, PromptTooLong) as e:
            raise HTTPException(400, str(e)) from None

    def batch(self, jobs):
        return list(jobs)

    def predict(self, jobs):
        """One list per generation step, one string per request: its JSON lines for this step."""
        ended = [False] * len(jobs)
        for _ in self.model.steps(jobs):
            out = []
            for i, job in enumerate(jobs):
                if ended[i]:
                    out.append("")
                    continue
                text = self.model.delta(job)
                line = json_line({"text": text}) if text else ""
                if job.done:  # its stream ends now, even while the batch goes on
                    ended[i] = True
                    line += json_line({"stats": self.model.finish(job)})
                out.append(line)
            yield out
        tail = ["" if e else json_line({"stats": self.model.finish(j)}) for j, e in zip(jobs, ended)]
        if any(tail):
            yield tail

    def unbatch(self, output):
        yield from output

    def encode_response(self, output_stream):
        yield from output_stream


def serve(args) -> None:
    api = ChatAPI(
        args.checkpoint,
        args.artifacts,
        args.device,
        args.threads,
        max_batch_size=args.max_batch,
        batch_timeout=args.batch_timeout,
        stream=True,
    )
    server = ls.LitServer(
        api, accelerator="cuda" if args.device.startswith("cuda") else "cpu", devices=1, timeout=args.queue_timeout
    )
    server.run(host="127.0.0.1", port=args.port, num_api_servers=1, generate_client_file=False, log_level="warning")

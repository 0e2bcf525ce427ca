"""The embedded default chat model, trained from the corpus: its tokenizer and chat template
(``tokenizer``), the training loop (``train``) and the build (``python -m
switchboard.training.chat``)."""

"""An exported model as the server sees it: its manifest and its tokenizer."""

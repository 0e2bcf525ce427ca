"""Pieces both channels use, text and speech, that know neither: incremental detokenization,
the latency breaker, metric tallies and the response streams of a decoupled pool."""

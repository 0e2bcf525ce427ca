"""Developer tooling outside the product and the bench suite: run from the repository's root
(``python -m tools.<module>``)."""

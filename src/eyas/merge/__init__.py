"""Stage 4 — merge: every tokenized dataset into one shuffled corpus with a held-out split."""

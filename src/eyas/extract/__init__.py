"""Stage 5 — extract: the target's auxiliary and final hidden states for every token."""

"""Stage 6 — train."""

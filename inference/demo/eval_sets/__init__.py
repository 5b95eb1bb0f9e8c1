"""Question sets for `python -m inference.demo.eval --questions` (never read by the trainer)."""

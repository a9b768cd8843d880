"""Evaluation-side timings: building RULER prompts (README.md here)."""

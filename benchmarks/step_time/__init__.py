"""Step time and memory: EndPrompt at P against full length at L, and the run planner's
prediction beside the measurement (``README.md`` here)."""

"""Mini-replication of EndPrompt's claim on a CPU (README.md here; ``make replicate``)."""

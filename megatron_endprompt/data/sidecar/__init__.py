"""On-disk formats and their checks: .bin/.idx, the EndPrompt sidecar, spans, terminals, CRCs."""

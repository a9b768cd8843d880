"""Writing a prefix: preprocess, sidecar building, merge, the atomic commit, generated corpora."""

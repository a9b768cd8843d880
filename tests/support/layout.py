"""The preprocessing tests' layout (P, L, b of the session's SentencePiece fixtures)."""

#: Small enough to be fast, large enough that the built-in prompts fit (``b = len(prompt) < P``)
#: and PoSE has room.
SPM_P, SPM_L, SPM_B = 64, 512, 8

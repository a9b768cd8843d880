"""The preprocessing tests' layout, in a module of its own so that any test can import it
(``from conftest import`` resolves to whichever ``conftest.py`` pytest loaded last)."""

#: Small enough to be fast, large enough that the built-in prompts fit (``b = len(prompt) < P``)
#: and PoSE has room.
SPM_P, SPM_L, SPM_B = 64, 512, 8

"""Passkey retrieval (landmark attention / PoSE, ``passkey``) and the pre-RULER prompts kept under
``legacy_*`` names (``legacy``), with the rows they give the task table (``tasks``)."""

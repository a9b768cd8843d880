"""Megatron's console loss on the second log line of a launch: a per-iteration value again.

``training_log`` sums each loss into ``total_loss_dict`` every iteration and, at a log line,
prints ``sum / advanced iterations`` and resets the sums. For the first iteration of a launch
``train()`` passes ``is_first_iteration=True``, which makes it print a line *without* resetting
(so that an interval that does not start at a log boundary still averages the whole interval).
When that first iteration *is* a log boundary (always with ``--log-interval 1``, the launcher's
default, and on every resume at a multiple of the interval), the next line averages this
iteration with the previous one: Megatron-Core 0.18.2, 0.19.2 and main (0.20.0) print the mean
of iterations 1 and 2 as iteration 2's loss (4.867335 shown, 4.687261 exact), the elapsed time
and the timers too. TensorBoard's per-iteration scalars (``loss_dict``) were always right.

The fix: a first iteration that falls on a log boundary is logged as every other boundary is
(``is_first_iteration=False``: sums and timers reset; its TensorBoard ``iteration-time`` is then
written as at every boundary). Off a boundary the flag is passed on unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

from megatron_endprompt.runtime.ledger import Ledger

__all__ = ["FINGERPRINTS", "patch_first_log_reset"]

_PATCH = "wheel"

#: ``training_log``'s fingerprint per reviewed release (0.20.0 = Megatron-LM main d98e8a64):
#: each has ``should_reset = not is_first_iteration`` and is called with the flag as a keyword.
FINGERPRINTS: dict[str, dict[str, str]] = {
    "training_log": {
        "0.18.2": "11cd706f9012",
        "0.19.2": "13cc2551f198",
        "0.20.0": "8f138b5438a5",
    },
}


def patch_first_log_reset(ledger: Ledger) -> None:
    """Wrap ``megatron.training.training.training_log`` (looked up by ``train()`` at each call)
    so that a launch's first iteration on a ``--log-interval`` boundary resets the sums."""
    import megatron.training.training as mt_training

    original = ledger.check(mt_training, "training_log", FINGERPRINTS["training_log"],
                            patch=_PATCH)
    ledger.check(mt_training, "get_args", None, patch=_PATCH)  # called by the wrapper below

    @functools.wraps(original)
    def training_log(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("is_first_iteration"):
            iteration = kwargs["iteration"] if "iteration" in kwargs else args[3]
            if iteration % mt_training.get_args().log_interval == 0:
                kwargs["is_first_iteration"] = False
        return original(*args, **kwargs)

    ledger.replace(mt_training, "training_log", training_log, patch=_PATCH)

"""The host side of a length check: `cgra.check_length(value, bound, what, how)` raising
errors.LengthPastBound when a run's symbolic length is past its bound.

Stage: device (run time). In: the values frontend/length_checks.py's calls pass. Out: nothing, or
the error naming the dimension, the bound and how to raise it, before the VM allocates anything.
"""

from __future__ import annotations

import tvm_ffi

from ..errors import LengthPastBound
from ..frontend.length_checks import CHECK


def _check_length(value, bound, what, how) -> None:
    if int(value) > int(bound):
        raise LengthPastBound(f"{what} = {int(value)} is past its bound {int(bound)}: the model was compiled for "
                              f"at most {int(bound)}; {how}")


tvm_ffi.register_global_func(CHECK, _check_length, override=True)

"""Names renamed in a release, kept for one more release with a DeprecationWarning.

Stage: shared. `renamed_property(old, new)` is a read-only attribute `old` that warns and returns
`new`; `warn_renamed` is the warning itself, for keyword arguments and module attributes.
"""

from __future__ import annotations

import warnings


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{old} is now called {new}; the old name will be removed in the next release",
                  DeprecationWarning, stacklevel=stacklevel)


def renamed_property(old: str, new: str) -> property:
    def getter(self):
        warn_renamed(f"{type(self).__name__}.{old}", f"{type(self).__name__}.{new}")
        return getattr(self, new)

    return property(getter, doc=f"Deprecated: the old name of `{new}`.")

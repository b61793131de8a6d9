"""Shared test configuration: Hypothesis profiles chosen by HYPOTHESIS_PROFILE.

`ci` (the default) is derandomised so a CI failure reproduces; `fuzz` runs many more examples.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=25, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=25, deadline=None)
settings.register_profile("fuzz", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` run only with CGRA_SLOW_TESTS=1 (the default run stays under 15 min)."""
    import pytest

    if os.environ.get("CGRA_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set CGRA_SLOW_TESTS=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

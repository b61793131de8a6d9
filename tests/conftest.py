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

"""Shared test configuration: Hypothesis profiles chosen by HYPOTHESIS_PROFILE, a persistent
kernel cache of the session's own, and the heuristic mapper unless CGRA_MAPPER says otherwise.

`ci` (the default) is derandomised so a CI failure reproduces; `fuzz` runs many more examples
(2,000 per test, or $CGRA_FUZZ_EXAMPLES).
"""

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=25, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=25, deadline=None)
# CGRA_FUZZ_EXAMPLES sets the fuzz profile's count: tests/test_differential_fuzz.py's docstring
# says how many fill an hour.
settings.register_profile("fuzz", max_examples=int(os.environ.get("CGRA_FUZZ_EXAMPLES", "2000")), deadline=None,
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


_SESSION_KERNEL_CACHE = []


def pytest_configure(config):
    """The session starts with an empty persistent kernel cache (device/kernel_cache.py) and
    mapping cache that its subprocesses share, so a kernel or mapping cached by an earlier run
    (or another checkout) cannot hide what this one compiles."""
    if "CGRA_KERNEL_CACHE" not in os.environ:
        _SESSION_KERNEL_CACHE.append(tempfile.mkdtemp(prefix="cgra-kernel-cache-"))
        os.environ["CGRA_KERNEL_CACHE"] = _SESSION_KERNEL_CACHE[-1]
    if "CGRA_MAPPING_CACHE" not in os.environ:  # the fabric mapper's (cgra_sim/mapping/mapper.py), likewise
        _SESSION_KERNEL_CACHE.append(tempfile.mkdtemp(prefix="cgra-mapping-cache-"))
        os.environ["CGRA_MAPPING_CACHE"] = _SESSION_KERNEL_CACHE[-1]
    # The figures tests assert are the heuristic mapper's, whether or not ortools (the solver
    # fallback) is installed; tests of the solver set CGRA_MAPPER themselves.
    os.environ.setdefault("CGRA_MAPPER", "heuristic")


def pytest_unconfigure(config):
    for folder in _SESSION_KERNEL_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


# The length-attention tests' (test_length_attention, test_open_length_attention).
@pytest.fixture
def key_tiles_only(monkeypatch):
    """The kernel over key tiles at every length (no whole-row branch), compiled afresh."""
    from npu_backend.kernels.attention import flash_length

    monkeypatch.setattr(flash_length, "choose_row_limits", lambda spec, arch, key_tiles: ())
    monkeypatch.setenv("CGRA_KERNEL_CACHE", "off")
    flash_length.choose_length_tiling.cache_clear()
    yield
    flash_length.choose_length_tiling.cache_clear()

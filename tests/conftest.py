"""Shared test settings: hypothesis profiles (select one with HYPOTHESIS_PROFILE=thorough)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "pytreestore",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=25,
)
settings.register_profile("thorough", parent=settings.get_profile("pytreestore"), max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "pytreestore"))

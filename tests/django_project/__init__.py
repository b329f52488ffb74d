"""A Django project for tests/test_django.py, run in subprocesses (settings are per process).

``AWA_TEST_DB`` (a libpq conninfo) is the test database; ``AWA_TEST_OVERRIDES`` (JSON)
replaces whole settings, e.g. ``{"AWA": {...}}``.
"""

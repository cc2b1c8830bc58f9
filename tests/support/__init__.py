"""Builders and fakes that more than one test module uses.

Test modules import from here (and from `tests.factories`, `tests.crd_schema`, the tiers'
harness modules), never from each other: a test module is collected and run as tests, and
one that doubles as a library drags its tests' imports and fixtures into every importer
(`tests/unit/test_test_imports.py` keeps it that way).
"""

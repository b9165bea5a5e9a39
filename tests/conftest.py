"""Test configuration: the multi-rank harness (see tests/multidevice.py)."""

pytest_plugins = ["tests.multidevice"]

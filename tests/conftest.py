"""Test configuration: the multi-rank harness (see tests/multidevice.py).

Every program any test executes through ``FusionDefinition.execute`` runs with
the race checker on (``HOSTIR_CHECK_RACES=1``); it is set here, before any
worker pool starts, so the ranks inherit it.
"""

import os

os.environ.setdefault("HOSTIR_CHECK_RACES", "1")

pytest_plugins = ["tests.multidevice"]

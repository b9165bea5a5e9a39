"""Test configuration: the multi-rank harness (see tests/multidevice.py).

Every program any test lowers through ``FusionDefinition`` is printed, parsed
back and compared (``HOSTIR_CHECK_ROUND_TRIP=1``), and the parsed copy is what
runs, with the race checker on (``HOSTIR_CHECK_RACES=1``); a program with a
pipelined loop runs a second time unpipelined and its outputs must be bitwise
equal (``HOSTIR_CHECK_PIPELINE=1``); every program runs both compiled and
interpreted, and the outputs must be bitwise equal (``HOSTIR_CHECK_COMPILED=1``).
All are set here, before any worker pool starts, so the ranks inherit them.

With ``HOSTIR_RECORD_PROGRAMS=DIR`` every program the run lowers is recorded in DIR
(tests/program_recorder.py; compare two recordings with scripts/record_programs.py).
"""

import os

os.environ.setdefault("HOSTIR_CHECK_RACES", "1")
os.environ.setdefault("HOSTIR_CHECK_ROUND_TRIP", "1")
os.environ.setdefault("HOSTIR_CHECK_PIPELINE", "1")
os.environ.setdefault("HOSTIR_CHECK_COMPILED", "1")

pytest_plugins = ["tests.program_recorder", "tests.multidevice", "tests.child_runs"]

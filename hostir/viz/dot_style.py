"""The typefaces shared by the pictures of :mod:`hostir.viz.dot` and
:mod:`hostir.viz.traffic_dot`."""

FONT = "Helvetica"
"""Captions, legends, edge labels and rank nodes."""

CODE_FONT = "Courier"
"""Printed instructions: the program view's node labels and loop headers."""

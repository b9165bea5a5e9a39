"""A script without ``fusion(world_size)``: ``hostir dump`` must say what to add."""

print("cli_no_fusion.py imported")  # a script's output goes to stderr, not into the dump

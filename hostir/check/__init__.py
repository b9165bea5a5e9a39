"""Static checks of a program: the verifier (types, extents, communications, chunked loops)
and the checks made when inputs are bound (extents, chunk indices and coverage, loop trip
counts, and the ops' rules on bound values).
"""

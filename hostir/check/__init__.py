"""Static checks of a program: the verifier (types, extents, communications, chunked loops)
and the extent checks made when inputs are bound.
"""

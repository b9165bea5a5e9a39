"""Pictures of a program (graphviz): its instructions, streams and loops, and the rank-to-
rank traffic of a communication or loop.
"""

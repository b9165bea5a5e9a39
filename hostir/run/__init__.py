"""The runtime: the evaluator, its handlers for compute, communications and streams,
pipelined loops and the race checker.
"""

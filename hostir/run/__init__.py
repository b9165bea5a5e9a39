"""The runtime: the evaluator (interpreting a program, or running it compiled to Python
for its rank), its handlers for compute, communications and streams, pipelined loops and
the race checker.
"""

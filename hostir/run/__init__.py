"""The runtime: the one run path (an executable prepared per program and input signature,
``hostir.run.executable``), the evaluator (interpreting a program, or running it compiled
to Python for its rank), its handlers for compute, communications and streams, pipelined
loops, the race checker and the self-checks.
"""

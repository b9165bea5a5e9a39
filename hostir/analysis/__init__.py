"""What a program moves: which blocks of a sharded tensor each rank holds, the exchanges of
a communication, the rank-to-rank traffic, the stages of a pipelined loop.
"""

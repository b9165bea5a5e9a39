"""The ranks and their collectives: communicators over ``torch.distributed`` (or one local
rank), the world, timeouts, the ranks' agreement and the local launcher.
"""

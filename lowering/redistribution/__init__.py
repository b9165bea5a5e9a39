"""The redistribution planner: the cheapest correct sequence of collectives (a ``Plan``) that
turns one distribution of a tensor into another, with its cost, memory and explanation."""

"""Failure handling: timeouts and deadlines, the retry budget, breakers, health, affinity, shedding."""

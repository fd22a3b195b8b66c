"""Observers of the decision record: trace log lines now; metrics and the trace store next."""

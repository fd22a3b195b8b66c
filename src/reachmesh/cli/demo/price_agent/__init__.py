"""The demo's price agent: run by ``reach demo``, or alone with ``reach agent``."""

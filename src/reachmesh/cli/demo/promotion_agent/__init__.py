"""The demo's promotion agent: run by ``reach demo``, or alone with ``reach agent``."""

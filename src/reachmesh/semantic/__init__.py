"""Routing by meaning: embedders and their factory, capability vectors, the index and its
scoring, and calibration. Only :mod:`.embedders` loads a model."""

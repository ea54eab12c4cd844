"""A run: the model loaded and adapted, the trainer of the method's record, its callbacks, checkpoints, what trained,
the prepared-data record, rank helpers, metrics lines, and the run's named moments (moments.py)."""

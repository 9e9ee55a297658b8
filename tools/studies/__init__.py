"""One-off studies behind a design decision, and probes of the floor under our costs.

Each module's docstring says what it measures; ``results/`` says what it found and what was
decided. They are kept runnable (and tested) so a decision can be checked again.
"""

"""DynamicDotGAT: the model (naive and optimised), its synthetic data, the training loop, the solver's run.

Importing this package imports torch; :mod:`plugins.ml.dotgat.problem` does not.
"""

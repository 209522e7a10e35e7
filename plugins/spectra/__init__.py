"""The spectrum-fitter plugin: batched stellar RV, vsini and parameter fits (issue 10, in progress)."""

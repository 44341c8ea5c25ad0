"""The demo: the command line (``python -m lossscale``), its plots, the results page and the gradient diagnostics.

Uses the library like any program; the library never imports it.
"""

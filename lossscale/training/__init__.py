"""MindSpore training: the managers, the one-graph train cell and its parts, ``Model``, checkpoints, the monitor.

Imports :mod:`lossscale.core`; never the front-ends or the demo.
"""

"""The ``tracerl`` command line (the top room): the parser, ``main`` and the one user-error wrapper (app), the
shared flags (args), ``tracerl bench`` (bench) and the commands on tracked runs and clusters (runs).

Public face: ``app.main`` (the console script).
"""

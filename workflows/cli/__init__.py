"""The ``tracerl`` command line (the top command room): the parser, ``main`` and the one user-error wrapper (app),
the shared flags and records (args), ``tracerl bench`` (bench), the command families added from outside the command
rooms (families) and the commands on tracked runs and clusters (runs).

Public face: ``app.main`` (the console script).
"""

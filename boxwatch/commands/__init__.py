"""Every verb of the ``boxwatch`` command line, one module each, plus what they share.

:mod:`boxwatch.cli` assembles them; :mod:`.console` holds the exit codes and output helpers.
Verbs of the offline half import the builder only when they run.
"""

"""Closing the loop: reviewed captures become a signed, checked monitor update.

Modules: :mod:`.feedback` (the captured inputs and the reviewers' labels, joined by record
id), :mod:`.refit` (a child artifact whose affected classes are re-clustered and whose
operating point is recalibrated), :mod:`.capture_report` (clusters of rejected inputs:
shift told apart from new kinds of input).
"""

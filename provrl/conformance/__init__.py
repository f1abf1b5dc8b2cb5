"""``provrl conformance``: statistical checks that an engine samples from the law it reports.

Rooms: :mod:`~provrl.conformance.stats` (the test statistics, pure functions),
:mod:`~provrl.conformance.config` (what is checked and at which level),
:mod:`~provrl.conformance.checks` (the checks against an engine),
:mod:`~provrl.conformance.run` (all checks, one report). See docs/conformance.md.
"""

"""Derivation callables of the example agent-memory catalog.

Each is ``def fn(ctx) -> list[dict]`` per :mod:`wakeline.catalog.contract`: it reads
``ctx.records`` (the driving-source rows as dicts) and ``ctx.now``, and returns
emissions.  All are deterministic: no wall clock, no randomness, no I/O; output is
sorted so the same input always produces the same list.
"""

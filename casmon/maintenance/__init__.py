"""Maintenance: what reads a whole store and keeps it sound.

``verify`` holds stats, verify and repair; ``gc`` marks, sweeps and condemns
under the gc lock. They depend on the store layer only.
"""

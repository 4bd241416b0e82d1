"""Helpers, worker modules and seed folders shared by the tests (tests/README.md lists them)."""

"""Helpers for tests and benchmarks that need real servers (not used by the library itself)."""

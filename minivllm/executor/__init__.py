"""Executors: how workers are started and driven."""

"""Benchmarks of the streaming 2SR and of training/evaluation throughput (see benchmarks/README.md)."""

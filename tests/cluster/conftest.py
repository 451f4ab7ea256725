"""Fixtures of the cluster tests; they live in `cluster_support.py` with the helpers the test
modules import."""

from cluster_support import s3_server, tiny_tree

__all__ = ["s3_server", "tiny_tree"]

"""Test support: a real multi-process localhost cluster (see `local_cluster`)."""

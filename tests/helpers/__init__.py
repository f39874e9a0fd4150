"""Shared builders and runners of the test suite (import them; never import another test file)."""

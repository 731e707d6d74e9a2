"""The conformance suite: properties every backend must honour (see conformance/README.md)."""

"""The conformance suite: properties every backend must honour (see docs/conformance.md)."""

"""Helpers the tests share (importable as ``support``: pytest's ``pythonpath`` holds ``tests/``)."""

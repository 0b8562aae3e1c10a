"""Gateway fixtures live in tests/conftest.py (shared with the pipeline tests)."""

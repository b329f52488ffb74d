"""Batch operations: types, operations, methods, duty; imports job and below, no capability."""

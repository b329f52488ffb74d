"""Descriptors: types, operations, declarations, duty; imports job and below, no capability."""

from awa.descriptors.operations import JobKindDescriptor, QueueDescriptor

__all__ = ["JobKindDescriptor", "QueueDescriptor"]

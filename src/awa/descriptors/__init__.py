"""Queue and job-kind descriptors: their types, declarations and statements (``operations``)
and the leader duty that stores and expires them (``duty``). Imports the producer, lifecycle
and below; no other capability."""

from awa.descriptors.operations import JobKindDescriptor, QueueDescriptor

__all__ = ["JobKindDescriptor", "QueueDescriptor"]

"""Durable batch operations (set priority, move queue, ... over many jobs): their types and
statements (``operations``), the clients' methods of one kind (``methods``) and the leader duty that
carries them out (``duty``). Imports the producer, lifecycle and below; no other capability."""

"""The core every package builds on: argument checks (``arguments``), args <-> JSON and kinds
(``kinds``), the optional extras (``extras``), outage logging (``outage``) and the leader
duty's shape (``duty``). Imports only ``awa.model``, ``awa.errors``, ``awa.sql`` and
``awa.version``."""

"""The asyncio worker runtime: claims jobs, runs handlers, commits their outcomes."""

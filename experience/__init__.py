"""The experience bank: pgvector storage, the ExperienceManager, retrieval and merging."""

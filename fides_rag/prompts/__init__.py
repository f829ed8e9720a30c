"""Prompts: fides-rag's two-path template, and raw prompts built by a framework."""

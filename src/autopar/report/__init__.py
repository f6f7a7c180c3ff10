"""Presentation: rich tables for the terminal (JSON comes from the result objects)."""

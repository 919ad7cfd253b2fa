"""Tuned best-per-shape tables, shipped as package data `autotune._tuned` (README.md here)."""

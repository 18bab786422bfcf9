"""Drafter modeling files (architecture only), shared by training and inference."""

"""Text processing: one definition of scripts and sentence ends; planning, streaming, normalization.

Pure Python, no model imports.
"""

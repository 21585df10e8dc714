"""Text processing: one definition of scripts and sentence ends; splitting, streaming, normalization.

Pure Python, no model imports.
"""

"""A recipe folder: finding it, the optional sections of the canonical train script, and its copies."""

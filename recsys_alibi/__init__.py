"""recsys-alibi: next-item ranking from long behaviour histories with an ALiBi transformer."""

__version__ = "0.1.0"

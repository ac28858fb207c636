"""A project whose tasks live in modules named by ``include=`` and ``imports``."""

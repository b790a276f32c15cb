"""The error normplug's library code raises for a bad option; its CLIs print it in one line."""


class NormplugError(ValueError):
    """A bad option or input, explained in one line."""

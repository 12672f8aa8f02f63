"""The error every plugin kind raises for a bad selection or option: its own floor, below both the registry and the
interfaces (the registry reads the interfaces, and an interface's refusal must not import the registry back)."""


class PluginError(Exception):
    """A plugin could not be selected, loaded or configured. ``str(e)`` is one actionable line."""

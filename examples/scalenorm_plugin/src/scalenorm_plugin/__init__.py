"""ScaleNorm for arch-lab: an example of a norm plugin shipped as its own package."""

from scalenorm_plugin.norm import ScaleNorm, ScaleNormStrategy

__all__ = ["ScaleNorm", "ScaleNormStrategy"]
__version__ = "0.1.0"

"""DataModules. Embedded small real data by default; real scale through token shards."""

from lit.data.text import TextDataModule

__all__ = ["TextDataModule"]

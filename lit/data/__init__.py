"""DataModules. Embedded small real data by default; real scale through token shards and image folders."""

from lit.data.digits import DigitsDataModule
from lit.data.imagenet import ImageFolderDataModule
from lit.data.text import TextDataModule

__all__ = ["DigitsDataModule", "ImageFolderDataModule", "TextDataModule"]

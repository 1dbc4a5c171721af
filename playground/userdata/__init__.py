"""Your own data: read a ``.jsonl``/``.json``/``.csv``/``.parquet`` file, map its columns to a conversation,
and check it against the model's chat template before anything starts. Torch-free (a visitor's kernel and
the CLI call it); the trainer converts rows with the same functions, so what was checked is what trains."""

from playground.userdata.check import DatasetReport, check_dataset
from playground.userdata.rows import FILE_SUFFIXES, DatasetError, read_rows
from playground.userdata.shapes import SHAPES, to_conversations

__all__ = ["FILE_SUFFIXES", "SHAPES", "DatasetError", "DatasetReport", "check_dataset", "read_rows", "to_conversations"]

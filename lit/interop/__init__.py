"""Hugging Face weights in and out: the mappings between our GPT and ``transformers`` checkpoints."""

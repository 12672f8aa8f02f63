"""Downstream evaluation of trained language models: scoring over token ids (``scoring``), the text codec a
checkpoint is read with (``text_codec``), the lm-evaluation-harness adapter (``lm_eval_adapter``, needs the
``eval`` extra) and ``cli.py lm-eval`` (``command``)."""

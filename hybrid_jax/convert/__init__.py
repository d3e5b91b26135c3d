"""Pretrained models in and out: Hugging Face Llama-family import/export, conversion to NHA."""

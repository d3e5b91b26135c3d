"""The description an experiment script's `--help` prints: its docstring's first paragraph."""


def first_paragraph(doc: str) -> str:
    """`doc`'s first paragraph on one line (argparse re-wraps it; a first line alone would cut
    a sentence that runs on)."""
    return " ".join(doc.split("\n\n")[0].split())

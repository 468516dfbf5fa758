from pathlib import Path

from agent.cli.config import render_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_config_reference_doc_matches_the_code():
    # Regenerate with: perfbalance config --reference (and keep the header of docs/config.md)
    assert render_reference() in DOC.read_text(), "docs/config.md is stale: regenerate the table"

"""What the commands (``python -m imagetx.train|evaluate|sample|export``) share: parsing
(``common``) and the rewriting of jsonargparse's errors into one line (``errors``)."""

"""The error a user can fix, apart from a bug: the commands print a ``UserError`` as one ``error:`` line
with exit code 2 (cli/common.py's ``run_or_exit``), any other exception with its traceback. A
``ValueError``, so that code catching ``ValueError`` still catches it. This module imports nothing, so
that a bad argument is refused before torch is imported.
"""


class UserError(ValueError):
    """Input a user can fix (a setting, a file, a request the model cannot serve): the message is
    one line naming the problem and the fix."""


def shown(text: str) -> str:
    """``text`` (a file's name, from a folder or from a file a stranger made) as a message shows it:
    each character that does not print (a newline, a terminal escape, a bidi override) written out as
    Python writes it in a string (\\n, \\x1b, \\u202e), so that a name can neither break a message's
    line nor rewrite the terminal; the rest as it is."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)

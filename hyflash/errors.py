"""One exception type for problems the user can fix.

The CLI prints these as a single line (no traceback) and exits with status 2.
"""


class HyflashError(Exception):
    """Bad input or environment; the message names the problem and the fix."""

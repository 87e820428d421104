"""The one exception users see.

Every problem with the user's input (a file, a flag, a config key) raises `BertgpuError` with a
single line that names the file (and line or field) and what was expected. The command line
turns it into `bertgpu: error: ...` and exit status 2, without a traceback.
"""


class BertgpuError(Exception):
    """A user-facing error whose message is one line: where, what was found, what was expected."""

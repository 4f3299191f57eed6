"""The error every command turns into one line and exit status 2."""


class InputError(ValueError):
    """Bad user input: the message names the problem; CLIs print it and exit 2."""

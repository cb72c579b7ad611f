"""The errors a user can fix: a config, a file, a path, a launch, a run that diverged.

Each says what is wrong and how to fix it. The command line prints such an error as one line and exits 1 (2 for
a config or an argument out of range); any other exception is a bug in this package and shows its traceback.
"""


class UserError(Exception):
    """A mistake the user can fix; its message names the problem and the fix."""


class DataError(UserError, ValueError):
    """Input text or a tokenizer that cannot be used as given (encoding, line counts, sizes)."""


class UsageError(UserError, ValueError):
    """Command-line arguments that do not go together."""


class ConfigError(UserError, ValueError):
    """The experiment config is wrong; the message says which field and how to fix it."""


class ArgumentError(UserError, ValueError):
    """An argument's value out of its range (a count below 1, a fraction above 1): exit 2, as for a value argparse
    refuses."""

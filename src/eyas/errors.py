"""User-facing errors. The CLI prints these as one `error:` line (plus a `hint:`), exit code 2."""


class EyasError(Exception):
    """An error caused by the input, not by eyas. `hint` says what to try next."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class FormatError(EyasError):
    """A checkpoint, config or data file cannot be read or identified."""


class ContractError(EyasError):
    """A checkpoint or a pairing (draft, target, data) violates the EAGLE-3 contract."""

"""eyas: read, check, run, train and debug EAGLE-3 draft models, offline."""

from eyas.contract import DraftContract, Verifier
from eyas.errors import ContractError, EyasError, FormatError

__all__ = ["DraftContract", "Verifier", "EyasError", "FormatError", "ContractError"]

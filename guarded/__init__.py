"""guarded: make any PenguiFlow StateStore production-safe and observable."""

from .errors import CapabilityError, GuardedError, InvalidPayloadError, SteeringValidationError
from .protocol import StateStore, capabilities, missing_capabilities, require_capabilities

__version__ = "0.1.0"

__all__ = [
    "CapabilityError",
    "GuardedError",
    "InvalidPayloadError",
    "StateStore",
    "SteeringValidationError",
    "__version__",
    "capabilities",
    "missing_capabilities",
    "require_capabilities",
]

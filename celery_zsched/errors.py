"""The exception hierarchy: the public path of :mod:`celery_zsched.core.errors`."""

from celery_zsched.core.errors import (
    BrokerUnavailable,
    ConfigurationError,
    FileError,
    ImportValidationError,
    JobFailed,
    JobNotFound,
    LayoutMismatch,
    StoreUnavailable,
    ValidationError,
    ZSchedError,
)

__all__ = ["BrokerUnavailable", "ConfigurationError", "FileError", "ImportValidationError",
           "JobFailed",
           "JobNotFound", "LayoutMismatch", "StoreUnavailable", "ValidationError", "ZSchedError"]

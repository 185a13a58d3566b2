"""Exceptions: every failed call of libdistdl-client raises a DistdlError subclass chosen
by the gRPC status code, carrying the code, its name and the library's message
("Step: INVALID_ARGUMENT: batch.x: expected shape ...").

Retryable failures are the same as the distdl CLI's exit codes 3 and 6 (docs/CLI.md):
UNAVAILABLE (the daemon cannot be reached or is shutting down: retry later, after a
restart) and ABORTED (a PushWeights raced a CreateModel that replaced the model: nothing
changed, push again). Their classes, Unavailable and Aborted, derive from Retryable, and
every DistdlError has `retryable`; anything else is permanent: the same call fails again."""

# gRPC status codes, as on the wire (ddl_rpc_code).
CODES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}

# The codes worth retrying as they are (CLI exit 3 and 6).
RETRYABLE = frozenset({10, 14})

# A failure the library found itself (no RPC reached the daemon: last code OK) is given the
# gRPC code its ddl_status corresponds to, the inverse of ddl_client.h's mapping; statuses
# without a counterpart (a local file error, malformed data) become UNKNOWN.
_LOCAL = {
    "DDL_EINVAL": 3, "DDL_ENOTFOUND": 5, "DDL_EBUSY": 9, "DDL_ENOMEM": 8,
    "DDL_ECORRUPT": 15, "DDL_ECANCELED": 1, "DDL_ETIMEDOUT": 4,
}


class DistdlError(Exception):
    """A failed call. code: the gRPC status code (int); code_name: "INVALID_ARGUMENT";
    message: the library's message; status: the ddl_status name ("DDL_EINVAL");
    local: True when the library refused the call before any RPC; retryable: True when the
    same call may succeed if made again (UNAVAILABLE, ABORTED)."""

    def __init__(self, code_name, code, message, status=None, local=False):
        # The library's messages already name the call and code ("Step: INVALID_ARGUMENT: ...").
        super().__init__(message if code_name in message else "%s: %s" % (code_name, message))
        self.code_name = code_name
        self.code = code
        self.message = message
        self.status = status
        self.local = local

    @property
    def retryable(self):
        return self.code in RETRYABLE


class Retryable(DistdlError):
    """The base of the retryable failures (Unavailable, Aborted): `except Retryable`."""


class Cancelled(DistdlError): pass             # noqa: E701
class Unknown(DistdlError): pass               # noqa: E701
class InvalidArgument(DistdlError): pass       # noqa: E701
class DeadlineExceeded(DistdlError): pass      # noqa: E701
class NotFound(DistdlError): pass              # noqa: E701
class AlreadyExists(DistdlError): pass         # noqa: E701
class PermissionDenied(DistdlError): pass      # noqa: E701
class ResourceExhausted(DistdlError): pass     # noqa: E701
class FailedPrecondition(DistdlError): pass    # noqa: E701
class Aborted(Retryable): pass                 # noqa: E701
class OutOfRange(DistdlError): pass            # noqa: E701
class Unimplemented(DistdlError): pass         # noqa: E701
class Internal(DistdlError): pass              # noqa: E701
class Unavailable(Retryable): pass             # noqa: E701
class DataLoss(DistdlError): pass              # noqa: E701
class Unauthenticated(DistdlError): pass       # noqa: E701


BY_CODE = {
    1: Cancelled, 2: Unknown, 3: InvalidArgument, 4: DeadlineExceeded, 5: NotFound,
    6: AlreadyExists, 7: PermissionDenied, 8: ResourceExhausted, 9: FailedPrecondition,
    10: Aborted, 11: OutOfRange, 12: Unimplemented, 13: Internal, 14: Unavailable,
    15: DataLoss, 16: Unauthenticated,
}


def make(code, message, status):
    """The exception for a failed call: code is ddl_client_last_code() (0 after a local
    error), status the ddl_status name, message ddl_last_error()."""
    local = code == 0
    if local:
        code = _LOCAL.get(status, 2)
    cls = BY_CODE.get(code, DistdlError)
    return cls(CODES.get(code, "UNKNOWN_CODE"), code, message, status=status, local=local)

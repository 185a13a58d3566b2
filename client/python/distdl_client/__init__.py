"""distdl_client: Python binding of libdistdl-client, the C client of the distdld daemon.

  from distdl_client import Client, InvalidArgument
  with Client(address_file="/tmp/addr") as c:
      for p in c.train(steps=200, progress_every=20):
          print(p.step, p.loss, p.accuracy)
      print(c.evaluate())                       # EvalResult(count, loss, accuracy)
      w = c.pull_weights()                      # {name: numpy array}

Needs only the Python standard library (ctypes), numpy and libdistdl-client.so (found
through $DDL_CLIENT_LIB, the installed library beside an installed package or the build
tree, then the system loader). See README.md.
"""
from ._native import LibraryNotFound
from .client import (CheckpointResult, Client, EvalResult, ModelInfo, Progress, PushResult,
                     Status, StepResult, SubmitResult, library_version, read_address_file,
                     read_safetensors, write_safetensors)
from .errors import (CODES, RETRYABLE, Aborted, AlreadyExists, Cancelled, DataLoss,
                     DeadlineExceeded, DistdlError, FailedPrecondition, Internal,
                     InvalidArgument, NotFound, OutOfRange, PermissionDenied,
                     ResourceExhausted, Retryable, Unauthenticated, Unavailable,
                     Unimplemented, Unknown)

__all__ = [
    "Client", "ModelInfo", "Status", "StepResult", "Progress", "EvalResult", "SubmitResult",
    "PushResult", "CheckpointResult", "library_version", "read_address_file",
    "read_safetensors", "write_safetensors", "LibraryNotFound", "CODES", "RETRYABLE",
    "DistdlError", "Retryable",
    "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
    "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
    "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
]

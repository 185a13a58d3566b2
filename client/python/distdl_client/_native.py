"""The C side of the binding: finds libdistdl-client, mirrors the structs of ddl_client.h
field for field and declares every function the binding calls.

The mirrors must match client/include/ddl_client.h exactly. tests/python/abi_test.py
compares every struct's size and every field's offset with what a C program compiled
against the header reports (py_client_ref abi), so a drift fails a test instead of
corrupting memory.
"""
import ctypes
import ctypes.util
import os
import threading

MAX_DIMS = 8  # DDL_CLIENT_MAX_DIMS

c_int = ctypes.c_int
c_int32 = ctypes.c_int32
c_int64 = ctypes.c_int64
c_double = ctypes.c_double
c_size_t = ctypes.c_size_t
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p


class LibraryNotFound(OSError):
    """libdistdl-client.so could not be loaded from any of the places searched."""


# ---- struct mirrors (in the order of ddl_client.h) ----------------------------------------

class Options(ctypes.Structure):  # ddl_client_options
    _fields_ = [
        ("connect_timeout_s", c_double),
        ("call_timeout_s", c_double),
        ("tls_ca_file", c_char_p),
        ("tls_cert_file", c_char_p),
        ("tls_key_file", c_char_p),
        ("tls_server_name", c_char_p),
        ("token", c_char_p),
        ("max_receive_bytes", c_int64),
        ("tune_malloc", c_int),
        ("own_connection", c_int),
    ]


class Tensor(ctypes.Structure):  # ddl_client_tensor
    _fields_ = [
        ("name", c_void_p),  # char *: a pointer, so that the library's memory can be freed
        ("dtype", c_int),    # ddl_wire_dtype
        ("ndim", c_int),
        ("shape", c_int64 * MAX_DIMS),
        ("data", c_void_p),
        ("bytes", c_size_t),
    ]


class Weights(ctypes.Structure):  # ddl_client_weights
    _fields_ = [
        ("count", c_int64),
        ("tensors", ctypes.POINTER(Tensor)),
    ]


class ModelInfo(ctypes.Structure):  # ddl_client_model_info
    _fields_ = [
        ("name", ctypes.c_char * 128),
        ("world_size", c_int32),
        ("num_parameters", c_int64),
        ("batch_size", c_int64),
        ("input_ndim", c_int),
        ("input_shape", c_int64 * MAX_DIMS),
        ("num_classes", c_int32),
        ("datatype", ctypes.c_char * 16),
    ]


class StatusInfo(ctypes.Structure):  # ddl_client_status_info
    _fields_ = [
        ("has_model", c_int),
        ("model_name", ctypes.c_char * 128),
        ("world_size", c_int32),
        ("step", c_int64),
        ("last_loss", c_double),
        ("durable_step", c_int64),
        ("queue_depth", c_int32),
        ("queue_capacity", c_int32),
        ("state", ctypes.c_char * 32),
        ("epoch", c_int64),
        ("batch", c_int64),
        ("batch_size", c_int64),
        ("input_ndim", c_int),
        ("input_shape", c_int64 * MAX_DIMS),
        ("num_classes", c_int32),
        ("datatype", ctypes.c_char * 16),
        ("data_dir", ctypes.c_char * 256),
        ("num_partitions", c_int32),
        ("active_calls", c_int32),
        ("request_queue_depth", c_int32),
        ("dropped_calls", c_int64),
        ("bytes_per_step", c_int64),
    ]


class Batch(ctypes.Structure):  # ddl_client_batch
    _fields_ = [
        ("x", Tensor),
        ("labels", Tensor),
        ("targets", Tensor),
    ]


class StepResult(ctypes.Structure):  # ddl_client_step_result
    _fields_ = [
        ("step", c_int64),
        ("loss", c_double),
        ("accuracy", c_double),
        ("durable", c_int),
        ("mse", c_double),
    ]


class TrainRequest(ctypes.Structure):  # ddl_client_train_request
    _fields_ = [
        ("steps", c_int64),
        ("epochs", c_int64),
        ("dataset", c_char_p),
        ("progress_every", c_int32),
    ]


class Progress(ctypes.Structure):  # ddl_client_progress
    _fields_ = [
        ("step", c_int64),
        ("epoch", c_int64),
        ("batch", c_int64),
        ("steps_per_epoch", c_int64),
        ("loss", c_double),
        ("accuracy", c_double),
        ("images_per_second", c_double),
        ("done", c_int64),
        ("total", c_int64),
        ("epoch_end", c_int),
        ("durable", c_int),
        ("finished", c_int),
        ("mean_loss", c_double),
        ("mse", c_double),
    ]


class EvalResult(ctypes.Structure):  # ddl_client_eval_result
    _fields_ = [
        ("count", c_int64),
        ("loss", c_double),
        ("accuracy", c_double),
        ("mse", c_double),
        ("rel_l2", c_double),
        ("fg_iou", c_double),
    ]


class CheckpointResult(ctypes.Structure):  # ddl_client_checkpoint_result
    _fields_ = [
        ("step", c_int64),
        ("durable", c_int),
        ("path", ctypes.c_char * 512),
    ]


# Every mirrored struct by its C name (the ABI test walks this table).
STRUCTS = {
    "ddl_client_options": Options,
    "ddl_client_tensor": Tensor,
    "ddl_client_weights": Weights,
    "ddl_client_model_info": ModelInfo,
    "ddl_client_status_info": StatusInfo,
    "ddl_client_batch": Batch,
    "ddl_client_step_result": StepResult,
    "ddl_client_train_request": TrainRequest,
    "ddl_client_progress": Progress,
    "ddl_client_eval_result": EvalResult,
    "ddl_client_checkpoint_result": CheckpointResult,
}

# int (*)(const ddl_client_progress *, void *)
PROGRESS_CB = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(Progress), c_void_p)

CLIENT_P = c_void_p  # ddl_client_t *
ST = c_int           # ddl_status
P = ctypes.POINTER

# name -> (restype, argtypes)
_PROTOTYPES = {
    "ddl_client_version_string": (c_char_p, []),
    "ddl_client_last_code": (c_int, []),
    "ddl_client_code_name": (c_char_p, [c_int]),
    "ddl_last_error": (c_char_p, []),
    "ddl_clear_error": (None, []),
    "ddl_status_name": (c_char_p, [c_int]),
    "ddl_client_options_default": (Options, []),
    "ddl_client_connect": (ST, [c_char_p, P(Options), P(CLIENT_P)]),
    "ddl_client_destroy": (None, [P(CLIENT_P)]),
    "ddl_client_tensor_release": (None, [P(Tensor)]),
    "ddl_client_weights_destroy": (None, [P(P(Weights))]),
    "ddl_client_health_check": (ST, [CLIENT_P, c_char_p, P(c_int)]),
    "ddl_client_server_live": (ST, [CLIENT_P, P(c_int)]),
    "ddl_client_server_ready": (ST, [CLIENT_P, P(c_int)]),
    "ddl_client_model_ready": (ST, [CLIENT_P, c_char_p, P(c_int)]),
    "ddl_client_model_infer": (ST, [CLIENT_P, c_char_p, P(Tensor), P(Tensor)]),
    "ddl_client_create_model": (ST, [CLIENT_P, c_char_p, c_char_p, c_int, P(ModelInfo)]),
    "ddl_client_get_status": (ST, [CLIENT_P, P(StatusInfo)]),
    "ddl_client_submit_batches": (ST, [CLIENT_P, P(Batch), c_int64, P(c_int32), P(c_int32)]),
    "ddl_client_step": (ST, [CLIENT_P, P(Batch), P(StepResult)]),
    "ddl_client_train": (ST, [CLIENT_P, P(TrainRequest), PROGRESS_CB, c_void_p, P(Progress)]),
    "ddl_client_evaluate": (ST, [CLIENT_P, c_char_p, c_char_p, P(Batch), P(EvalResult)]),
    "ddl_client_predict": (ST, [CLIENT_P, P(Tensor), P(Tensor)]),
    "ddl_client_pull_weights": (ST, [CLIENT_P, P(P(Weights))]),
    "ddl_client_pull_weights_to_file": (ST, [CLIENT_P, c_char_p]),
    "ddl_client_push_weights": (ST, [CLIENT_P, P(Tensor), c_int64, P(c_int32), P(c_int64)]),
    "ddl_client_push_weights_from_file": (ST, [CLIENT_P, c_char_p]),
    "ddl_safetensors_read": (ST, [c_char_p, P(P(Weights))]),
    "ddl_safetensors_write": (ST, [c_char_p, P(Weights)]),
    "ddl_client_checkpoint": (ST, [CLIENT_P, c_char_p, P(CheckpointResult)]),
    "ddl_client_restore": (ST, [CLIENT_P, c_int64, c_char_p, P(c_int64)]),
    "ddl_client_shutdown": (ST, [CLIENT_P, c_int, P(c_int64)]),
}

_LIBNAME = "libdistdl-client.so"
_lock = threading.Lock()
_lib = None


def candidates():
    """Where the library is looked for, in order: $DDL_CLIENT_LIB; for an installed package
    (cmake --install wrote _installed.py) the library installed with it, else the build
    trees next to this source tree (build/lib of the repository that holds client/python);
    then the system loader (LD_LIBRARY_PATH, ldconfig)."""
    out = []
    env = os.environ.get("DDL_CLIENT_LIB")
    if env:
        out.append(env)
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from . import _installed
    except ImportError:
        _installed = None
    if _installed is not None:
        out.append(os.path.normpath(os.path.join(here, _installed.LIBDIR, _LIBNAME + ".0")))
    else:
        repo = os.path.normpath(os.path.join(here, "..", "..", ".."))
        for b in ("build", "build-release", "build-asan"):
            out.append(os.path.join(repo, b, "lib", _LIBNAME))
    out.append(_LIBNAME + ".0")
    found = ctypes.util.find_library("distdl-client")
    if found:
        out.append(found)
    return out


def load():
    """The loaded library with every prototype declared (loaded once per process)."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        env = os.environ.get("DDL_CLIENT_LIB")
        for path in candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append("%s (no such file)" % path)
                if path == env:
                    # An explicit choice that does not exist is an error, not a hint.
                    raise LibraryNotFound("DDL_CLIENT_LIB=%s: no such file" % env)
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
                if path == env:
                    raise LibraryNotFound("DDL_CLIENT_LIB=%s cannot be loaded: %s" % (env, e))
                continue
            for name, (res, args) in _PROTOTYPES.items():
                f = getattr(lib, name)
                f.restype = res
                f.argtypes = args
            _lib = lib
            return lib
        raise LibraryNotFound(
            "libdistdl-client not found: build it (cmake --build build) or set DDL_CLIENT_LIB "
            "to the path of libdistdl-client.so; tried: " + "; ".join(tried))

"""Client: one connection to a distdld daemon, over libdistdl-client (ctypes).

Every method is one call of the C library and blocks until its RPC has finished; a failure
raises a DistdlError subclass (errors.py). Arrays go in as numpy arrays (float32, float64,
uint8 or int64; C-contiguous native-endian arrays are passed without a copy) and come out
as numpy arrays that own their memory (the library's buffers are copied and released).
"""
import ctypes
import dataclasses
import json
import os
import queue
import threading
from typing import Tuple

import numpy as np

from . import _native as N
from . import errors

# numpy dtype <-> ddl_wire_dtype
_WIRE = {np.dtype(np.float32): 0, np.dtype(np.float64): 1,
         np.dtype(np.int64): 2, np.dtype(np.uint8): 3}
_NUMPY = {v: k for k, v in _WIRE.items()}
_HEALTH = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


# ---- result records ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelInfo:
    name: str
    world_size: int
    num_parameters: int
    batch_size: int
    input_shape: Tuple[int, ...]  # per sample
    num_classes: int
    datatype: str


@dataclasses.dataclass(frozen=True)
class Status:
    has_model: bool
    model_name: str
    world_size: int
    step: int
    last_loss: float
    durable_step: int  # -1: none
    queue_depth: int
    queue_capacity: int
    state: str  # "idle", "training", "shutting_down"
    epoch: int
    batch: int
    batch_size: int
    input_shape: Tuple[int, ...]
    num_classes: int
    datatype: str
    data_dir: str
    num_partitions: int
    active_calls: int  # gRPC calls not yet answered, this one excluded
    request_queue_depth: int  # engine requests waiting
    dropped_calls: int  # queued calls dropped unrun (cancelled, past their deadline)
    bytes_per_step: int  # payload one training step moves between ranks; 0 before the first


@dataclasses.dataclass(frozen=True)
class StepResult:
    step: int
    loss: float
    accuracy: float  # -1 where none applies (dense targets but bce)
    durable: bool
    mse: float = -1.0  # dense targets: of the step's prediction


@dataclasses.dataclass(frozen=True)
class Progress:
    """One Train progress record. The last one of a run has finished=True and carries the
    run's mean loss and accuracy (not one step's)."""
    step: int
    epoch: int
    batch: int
    steps_per_epoch: int
    loss: float
    accuracy: float
    images_per_second: float
    done: int
    total: int
    epoch_end: bool
    durable: bool
    finished: bool
    mean_loss: float
    mse: float = -1.0  # dense targets: this step's mean squared error

    def as_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class EvalResult:
    count: int
    loss: float
    accuracy: float      # -1 where none applies (regression)
    mse: float = -1.0    # dense targets: of the prediction
    rel_l2: float = -1.0  # dense targets: ||prediction - target|| / ||target||
    fg_iou: float = -1.0  # segmentation (a whole split): the foreground mean IoU


@dataclasses.dataclass(frozen=True)
class SubmitResult:
    accepted: int
    queue_depth: int


@dataclasses.dataclass(frozen=True)
class PushResult:
    tensors: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class CheckpointResult:
    step: int
    durable: bool
    path: str


# ---- helpers -------------------------------------------------------------------------------

def _s(b):
    return b.decode("utf-8", "replace")


def _opt(s):
    return None if s is None else os.fsencode(s)


def _check(lib, st):
    if st != 0:
        code = lib.ddl_client_last_code()
        msg = _s(lib.ddl_last_error() or b"")
        raise errors.make(code, msg, _s(lib.ddl_status_name(st)))


def _as_array(a, what, targets=False):
    """A C-contiguous native-endian array the library can read as it is. Targets of any
    integer dtype (class labels) become int64, and float16 fields float32; other inputs
    must already have a wire dtype."""
    if not isinstance(a, np.ndarray):
        a = np.asarray(a)
    if targets:
        if a.dtype.kind in "iub":
            a = a.astype(np.int64, copy=False)
        elif a.dtype == np.float16:
            a = a.astype(np.float32)
        elif a.dtype.kind != "f":
            raise TypeError("%s: targets must be integer class indices or float values, got "
                            "dtype %s" % (what, a.dtype))
    dt = a.dtype.newbyteorder("=")
    if dt not in _WIRE:
        raise TypeError("%s: dtype %s is not supported (float32, float64, uint8, int64)"
                        % (what, a.dtype))
    if a.ndim < 1 or a.ndim > N.MAX_DIMS:
        raise ValueError("%s: expected 1 to %d dimensions, got %d" % (what, N.MAX_DIMS, a.ndim))
    return np.ascontiguousarray(a, dtype=dt)


def _tensor(a, name=None):
    """A ddl_client_tensor that borrows a's memory (keep a alive during the call)."""
    t = N.Tensor()
    t.name = ctypes.cast(ctypes.c_char_p(name), ctypes.c_void_p).value if name else None
    t.dtype = _WIRE[a.dtype]
    t.ndim = a.ndim
    for i, n in enumerate(a.shape):
        t.shape[i] = n
    t.data = a.ctypes.data if a.nbytes else None
    t.bytes = a.nbytes
    return t


def _to_numpy(t):
    """A copy of a library-owned tensor as a numpy array."""
    if t.dtype not in _NUMPY:
        raise errors.DistdlError("UNKNOWN", 2, "the daemon sent a tensor of unknown dtype %d"
                                 % t.dtype)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    out = np.empty(shape, dtype=_NUMPY[t.dtype])
    if out.nbytes != t.bytes:
        raise errors.DistdlError("UNKNOWN", 2, "tensor of shape %s holds %d bytes, expected %d"
                                 % (shape, t.bytes, out.nbytes))
    if out.nbytes:
        ctypes.memmove(out.ctypes.data, t.data, out.nbytes)
    return out


def _weights_to_dict(lib, wp):
    """Copies a ddl_client_weights set into {name: array} and destroys it."""
    try:
        w = wp.contents
        out = {}
        for i in range(w.count):
            t = w.tensors[i]
            name = _s(ctypes.string_at(t.name)) if t.name else ""
            out[name] = _to_numpy(t)
        return out
    finally:
        lib.ddl_client_weights_destroy(ctypes.byref(wp))


def _check_weights(weights):
    if not isinstance(weights, dict) or not weights:
        raise TypeError("weights must be a non-empty dict of name -> numpy array")
    names, arrays = [], []
    for k, v in weights.items():
        if not isinstance(k, str) or not k:
            raise TypeError("weights: names must be non-empty strings, got %r" % (k,))
        names.append(k.encode())
        arrays.append(_as_array(v, "weights[%r]" % k))
    return names, arrays


def _batch(x, y, what):
    """x [n, sample...] and the targets y: class labels [n] (or [n, spatial...] for
    segmentation) of any integer dtype, or float values shaped like the model's output."""
    xa = _as_array(x, what + ": x")
    ya = _as_array(y, what + ": y", targets=True)
    b = N.Batch()
    b.x = _tensor(xa)
    b.targets = _tensor(ya)
    return b, (xa, ya)


def _progress(p):
    return Progress(p.step, p.epoch, p.batch, p.steps_per_epoch, p.loss, p.accuracy,
                    p.images_per_second, p.done, p.total, bool(p.epoch_end), bool(p.durable),
                    bool(p.finished), p.mean_loss, p.mse)


def read_address_file(path):
    """The "host:port" a daemon wrote to its --address-file."""
    try:
        with open(path) as f:
            a = f.read().strip()
    except OSError as e:
        raise FileNotFoundError("address file %s: %s" % (path, e.strerror)) from None
    if not a:
        raise ValueError("address file %s is empty (is the daemon still starting?)" % path)
    return a


def library_version():
    """The loaded libdistdl-client's version ("0.1.0")."""
    return _s(N.load().ddl_client_version_string())


def read_safetensors(path):
    """{name: array} from a safetensors file (F32, F64, I64, U8), read by the C library."""
    lib = N.load()
    wp = ctypes.POINTER(N.Weights)()
    _check(lib, lib.ddl_safetensors_read(os.fsencode(path), ctypes.byref(wp)))
    return _weights_to_dict(lib, wp)


def write_safetensors(path, weights):
    """Writes {name: array} as a safetensors file (temp file, fsync, rename)."""
    lib = N.load()
    names, arrays = _check_weights(weights)
    ts = (N.Tensor * len(arrays))(*[_tensor(a, n) for a, n in zip(arrays, names)])
    w = N.Weights(len(arrays), ctypes.cast(ts, ctypes.POINTER(N.Tensor)))
    _check(lib, lib.ddl_safetensors_write(os.fsencode(path), ctypes.byref(w)))


# ---- the client ------------------------------------------------------------------------------

class Client:
    """A connection to distdld.

      with Client("127.0.0.1:50051") as c:
          for p in c.train(steps=100, progress_every=10):
              print(p.step, p.loss)
          print(c.evaluate())

    address: "host:port" or "unix:/path"; or address_file: the daemon's --address-file.
    With neither, $DDL_ADDRESS, then $DDL_ADDRESS_FILE. timeout: seconds to wait for the
    channel (0: connect on the first call); call_timeout: deadline of unary calls (0: none).
    tls_ca / tls_cert / tls_key / tls_server_name / token: passed to ddl_client_options.
    Calls may come from any thread; close() waits for the calls in progress.
    """

    def __init__(self, address=None, *, address_file=None, timeout=10.0, call_timeout=0.0,
                 tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None, token=None,
                 max_receive_bytes=0, tune_malloc=False, own_connection=False):
        if address is None and address_file is None:
            address = os.environ.get("DDL_ADDRESS") or None
            address_file = os.environ.get("DDL_ADDRESS_FILE") or None
        if address is None and address_file is None:
            raise ValueError("Client: give an address (\"host:port\"), an address_file, or "
                             "set DDL_ADDRESS or DDL_ADDRESS_FILE")
        if address is not None and address_file is not None:
            raise ValueError("Client: give address or address_file, not both")
        if address_file is not None:
            address = read_address_file(address_file)
        if not isinstance(address, str) or not address:
            raise ValueError("Client: address must be a non-empty string, got %r" % (address,))
        if timeout < 0 or call_timeout < 0:
            raise ValueError("Client: timeouts must be >= 0, got timeout=%r call_timeout=%r"
                             % (timeout, call_timeout))
        self.address = address
        self._lib = N.load()
        o = self._lib.ddl_client_options_default()
        o.connect_timeout_s = float(timeout)
        o.call_timeout_s = float(call_timeout)
        # The options hold pointers into these bytes objects: keep them for the call.
        self._keep = [_opt(tls_ca), _opt(tls_cert), _opt(tls_key),
                      None if tls_server_name is None else tls_server_name.encode(),
                      None if token is None else token.encode()]
        (o.tls_ca_file, o.tls_cert_file, o.tls_key_file, o.tls_server_name,
         o.token) = self._keep
        o.max_receive_bytes = int(max_receive_bytes)
        o.tune_malloc = 1 if tune_malloc else 0
        o.own_connection = 1 if own_connection else 0
        self._cv = threading.Condition()
        self._calls = 0
        self._closing = False
        self._trains = set()  # cancel flags (threading.Event) of the Trains in progress
        h = N.CLIENT_P()
        st = self._lib.ddl_client_connect(address.encode(), ctypes.byref(o), ctypes.byref(h))
        self._keep = None
        _check(self._lib, st)
        self._h = h

    # -- lifetime --

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self):
        return getattr(self, "_h", None) is None or not self._h

    def close(self):
        """Cancels any Train in progress, waits for the calls in progress, closes the
        channel. Safe to call twice."""
        if getattr(self, "_h", None) is None:
            return
        with self._cv:
            if self._closing:
                return
            self._closing = True
            for ev in self._trains:
                ev.set()
            while self._calls:
                self._cv.wait()
        h, self._h = self._h, None
        self._lib.ddl_client_destroy(ctypes.byref(h))

    def _enter(self):
        with self._cv:
            if self._closing or getattr(self, "_h", None) is None:
                raise ValueError("Client: the connection is closed")
            self._calls += 1

    def _leave(self):
        with self._cv:
            self._calls -= 1
            self._cv.notify_all()

    def _call(self, fn, *args):
        """Runs one library call on this connection; raises on failure."""
        self._enter()
        try:
            _check(self._lib, fn(self._h, *args))
        finally:
            self._leave()

    # -- health and inference --

    def health(self, service=""):
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN"."""
        out = ctypes.c_int()
        self._call(self._lib.ddl_client_health_check, service.encode(), ctypes.byref(out))
        return _HEALTH.get(out.value, "UNKNOWN")

    def server_live(self):
        out = ctypes.c_int()
        self._call(self._lib.ddl_client_server_live, ctypes.byref(out))
        return bool(out.value)

    def server_ready(self):
        out = ctypes.c_int()
        self._call(self._lib.ddl_client_server_ready, ctypes.byref(out))
        return bool(out.value)

    def model_ready(self, model=""):
        out = ctypes.c_int()
        self._call(self._lib.ddl_client_model_ready, model.encode(), ctypes.byref(out))
        return bool(out.value)

    def infer(self, x, model=""):
        """KServe ModelInfer with one input: the first output (logits) as an array."""
        xa = _as_array(x, "infer: x")
        t, out = _tensor(xa), N.Tensor()
        self._call(self._lib.ddl_client_model_infer, model.encode(), ctypes.byref(t),
                   ctypes.byref(out))
        try:
            return _to_numpy(out)
        finally:
            self._lib.ddl_client_tensor_release(ctypes.byref(out))

    # -- trainer --

    def create(self, spec, name=None, replace=False):
        """CreateModel. spec: a dict, the JSON text of a spec, or the path of a spec file.
        Returns a ModelInfo."""
        if isinstance(spec, dict):
            text = json.dumps(spec)
        elif isinstance(spec, (str, os.PathLike)):
            s = os.fspath(spec)
            if s.lstrip().startswith("{"):
                text = s
            else:
                try:
                    with open(s) as f:
                        text = f.read()
                except OSError as e:
                    raise FileNotFoundError("create: spec file %s: %s" % (s, e.strerror)) from None
        else:
            raise TypeError("create: spec must be a dict, JSON text or a file path, got %s"
                            % type(spec).__name__)
        info = N.ModelInfo()
        self._call(self._lib.ddl_client_create_model, text.encode(),
                   None if name is None else name.encode(), 1 if replace else 0,
                   ctypes.byref(info))
        return ModelInfo(_s(info.name), info.world_size, info.num_parameters, info.batch_size,
                         tuple(info.input_shape[:info.input_ndim]), info.num_classes,
                         _s(info.datatype))

    def status(self):
        """GetStatus as a Status record."""
        s = N.StatusInfo()
        self._call(self._lib.ddl_client_get_status, ctypes.byref(s))
        return Status(bool(s.has_model), _s(s.model_name), s.world_size, s.step, s.last_loss,
                      s.durable_step, s.queue_depth, s.queue_capacity, _s(s.state), s.epoch,
                      s.batch, s.batch_size, tuple(s.input_shape[:s.input_ndim]),
                      s.num_classes, _s(s.datatype), _s(s.data_dir), s.num_partitions,
                      s.active_calls, s.request_queue_depth, s.dropped_calls, s.bytes_per_step)

    def submit(self, x, y):
        """SubmitBatch with one batch (x [n, sample...] and its targets y: labels [n], a
        class per output voxel, or dense values shaped like the output); see submit_many."""
        return self.submit_many([(x, y)])

    def submit_many(self, batches):
        """SubmitBatch: streams the (x, y) batches into the daemon's queue, for step()
        without a batch. Returns SubmitResult(accepted, queue_depth)."""
        batches = list(batches)
        if not batches:
            raise ValueError("submit: no batches")
        arr = (N.Batch * len(batches))()
        keep = []
        for i, (x, y) in enumerate(batches):
            arr[i], k = _batch(x, y, "submit[%d]" % i)
            keep.append(k)
        acc, depth = ctypes.c_int32(), ctypes.c_int32()
        self._call(self._lib.ddl_client_submit_batches, arr, len(batches), ctypes.byref(acc),
                   ctypes.byref(depth))
        return SubmitResult(acc.value, depth.value)

    def step(self, x=None, y=None):
        """Step: one optimizer step on the batch (x, y), or on the next submitted batch
        when both are None. y: the targets (see submit). Returns StepResult(step, loss,
        accuracy, durable, mse)."""
        r = N.StepResult()
        if x is None and y is None:
            self._call(self._lib.ddl_client_step, None, ctypes.byref(r))
        elif x is None or y is None:
            raise ValueError("step: give both x and y, or neither (the next submitted batch)")
        else:
            b, keep = _batch(x, y, "step")
            self._call(self._lib.ddl_client_step, ctypes.byref(b), ctypes.byref(r))
            del keep
        return StepResult(r.step, r.loss, r.accuracy, bool(r.durable), r.mse)

    def train(self, steps=0, epochs=0, dataset=None, progress_every=0):
        """Train over the daemon's dataset: a generator of Progress records, every
        progress_every steps (0: every step) and at each epoch end, then a last record with
        finished=True. Give exactly one of steps or epochs.

        The C call runs on a worker thread. Leaving the loop early (break, an exception,
        close()) cancels the Train: the daemon stops at the step boundary after the next
        record and the generator returns once it has. A failed Train raises its
        DistdlError from the generator."""
        if (steps > 0) == (epochs > 0) or steps < 0 or epochs < 0:
            raise ValueError("train: give exactly one of steps > 0 or epochs > 0, got steps=%r "
                             "epochs=%r" % (steps, epochs))
        if progress_every < 0:
            raise ValueError("train: progress_every must be >= 0, got %r" % (progress_every,))
        req = N.TrainRequest(int(steps), int(epochs),
                             None if dataset is None else dataset.encode(), int(progress_every))
        return self._train(req)

    def _train(self, req):
        q = queue.Queue()
        cancel = threading.Event()
        done = object()

        def on_progress(p, _ud):
            try:
                q.put(_progress(p.contents))
                return 1 if cancel.is_set() else 0
            except BaseException:  # never let an exception unwind through C
                return 1

        cb = N.PROGRESS_CB(on_progress)

        def worker():
            try:
                st = self._lib.ddl_client_train(self._h, ctypes.byref(req), cb, None, None)
                if st != 0:
                    code = self._lib.ddl_client_last_code()
                    msg = _s(self._lib.ddl_last_error() or b"")
                    q.put(errors.make(code, msg, _s(self._lib.ddl_status_name(st))))
            except BaseException as e:
                q.put(e)
            finally:
                q.put(done)
                self._leave()

        self._enter()
        with self._cv:
            self._trains.add(cancel)
        t = threading.Thread(target=worker, name="distdl-train", daemon=True)
        try:
            t.start()
        except BaseException:
            self._leave()
            raise
        failure = None
        ended = False
        try:
            while True:
                item = q.get()
                if item is done:
                    ended = True
                    break
                if isinstance(item, BaseException):
                    failure = item
                    continue
                yield item
        finally:
            # Normal end, or the consumer left (GeneratorExit): cancel, drain, join.
            if not ended:
                cancel.set()
            t.join()
            with self._cv:
                self._trains.discard(cancel)
        if failure is not None:
            if not (cancel.is_set() and isinstance(failure, errors.Cancelled)):
                raise failure

    def evaluate(self, x=None, y=None, dataset=None, split="test"):
        """Evaluate on a daemon dataset split ("test" or "train"), or on the inline samples
        (x, y) when given (y: the targets, see submit). Returns EvalResult(count, loss,
        accuracy, mse, rel_l2, fg_iou)."""
        r = N.EvalResult()
        ds = None if dataset is None else dataset.encode()
        sp = None if split is None else split.encode()
        if x is None and y is None:
            self._call(self._lib.ddl_client_evaluate, ds, sp, None, ctypes.byref(r))
        elif x is None or y is None:
            raise ValueError("evaluate: give both x and y, or neither (a daemon dataset)")
        else:
            b, keep = _batch(x, y, "evaluate")
            self._call(self._lib.ddl_client_evaluate, ds, sp, ctypes.byref(b), ctypes.byref(r))
            del keep
        return EvalResult(r.count, r.loss, r.accuracy, r.mse, r.rel_l2, r.fg_iou)

    def predict(self, x):
        """Predict: the model's whole output for x [n, sample...] (model dtype, or uint8
        pixels that the daemon normalises): logits [n, classes], or [n, C, spatial...] for
        segmentation and dense models."""
        xa = _as_array(x, "predict: x")
        t, out = _tensor(xa), N.Tensor()
        self._call(self._lib.ddl_client_predict, ctypes.byref(t), ctypes.byref(out))
        try:
            return _to_numpy(out)
        finally:
            self._lib.ddl_client_tensor_release(ctypes.byref(out))

    def pull_weights(self, path=None):
        """PullWeights: the global weights as {name: array}, in the daemon's order; or, with
        path, into a safetensors file (returns None)."""
        if path is not None:
            self._call(self._lib.ddl_client_pull_weights_to_file, os.fsencode(path))
            return None
        wp = ctypes.POINTER(N.Weights)()
        self._call(self._lib.ddl_client_pull_weights, ctypes.byref(wp))
        return _weights_to_dict(self._lib, wp)

    def push_weights(self, weights):
        """PushWeights: every weight of the model, each once ({name: array} as pull_weights
        returns it, or the path of a safetensors file). Returns PushResult(tensors, bytes)
        (zeros for a file)."""
        if isinstance(weights, (str, os.PathLike)):
            self._call(self._lib.ddl_client_push_weights_from_file, os.fsencode(weights))
            return PushResult(0, 0)
        names, arrays = _check_weights(weights)
        ts = (N.Tensor * len(arrays))(*[_tensor(a, n) for a, n in zip(arrays, names)])
        nt, nb = ctypes.c_int32(), ctypes.c_int64()
        self._call(self._lib.ddl_client_push_weights, ts, len(arrays), ctypes.byref(nt),
                   ctypes.byref(nb))
        return PushResult(nt.value, nb.value)

    def checkpoint(self, dir=None):
        """Checkpoint into dir (None: the daemon's --checkpoint-dir)."""
        r = N.CheckpointResult()
        self._call(self._lib.ddl_client_checkpoint, _opt(dir), ctypes.byref(r))
        return CheckpointResult(r.step, bool(r.durable), _s(r.path))

    def restore(self, step=-1, dir=None):
        """Restore checkpoint `step`, or the newest durable one when step < 0, from dir
        (None: --checkpoint-dir). Returns the restored step."""
        out = ctypes.c_int64()
        self._call(self._lib.ddl_client_restore, int(step), _opt(dir), ctypes.byref(out))
        return out.value

    def shutdown(self, checkpoint=False):
        """Shutdown the daemon (after a final checkpoint when checkpoint=True). Returns the
        durable step (-1: none)."""
        out = ctypes.c_int64(-1)
        self._call(self._lib.ddl_client_shutdown, 1 if checkpoint else 0, ctypes.byref(out))
        return out.value

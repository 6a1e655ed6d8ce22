"""convd: grouped 2-D convolution served by the convd daemon, from numpy and PyTorch.

    import convd
    with convd.connect() as client:              # $CONVD_SOCKET, else /run/convd/convd.sock
        y = client.conv2d(x, w, b, stride=1, padding="same", groups=32, relu=True)

    import convd.torch                           # PyTorch models: every Conv2d through convd
    model = convd.torch.patch(model, client)

Pure Python over libconvd-client through ctypes. The library is found through
$CONVD_CLIENT_LIB, else the loader's search path (libconvd-client.so.0). numpy is required,
torch is optional. docs/python.md in the convd sources describes the package in full.
"""

from __future__ import annotations

from convd import _lib
from convd._errors import Code, Error, PerformanceWarning
from convd._lib import LibraryError

# Load the library now, so that a library whose structs differ from this package's mirrors
# (_lib.check_layouts) fails the import. A missing library is reported by connect() instead, so
# that the package can be imported (for its documentation, say) where none is installed.
try:
    _lib.load()
except _lib.LibraryNotFound:
    pass

__version__ = "0.1.0"

__all__ = [
    "connect", "Client", "Future", "Error", "Code", "LibraryError", "PerformanceWarning",
    "library_path",
]


def connect(socket=None, **options):
    """Connects to the daemon and returns a Client (a context manager).

    socket: the daemon's socket path; None takes $CONVD_SOCKET, else /run/convd/convd.sock.
    Options (keywords): timeout_ms (connecting and the handshake, and the answers to ping,
    status and metrics; default 5000), client_name (shown in the daemon's log), use_rings (1,
    0, or -1 for the library's default) and spin_us (see convd_connect_options in convd.h);
    stream_ordered: None (the default) orders convolutions of CUDA tensors on the caller's
    stream, returning at once, when the daemon speaks protocol 3 (unless $CONVD_STREAM_ORDERED
    is 0); False synchronises the stream and waits for each result, as before protocol 3; True
    insists (CONVD_EUNSUPPORTED when the daemon cannot). Errors of stream-ordered convolutions
    are raised by the next call or by Client.synchronize(); cuda_wait: "block" (the default,
    unless $CONVD_CUDA_WAIT says "keep") makes this process's CUDA context on a device block
    in its waits for the GPU (torch.cuda.synchronize()) instead of spinning, from the first
    convolution of CUDA tensors there, unless the process chose how it waits: a spinning
    process takes a CPU the daemon's threads need for its convolutions; "keep" leaves it.
    Raises convd.Error (CONVD_ECONNECT when no daemon listens there) or convd.LibraryError
    when libconvd-client cannot be loaded.
    """
    from convd._client import Client

    return Client(socket, **options)


def library_path():
    """The name or path libconvd-client was loaded from; loads it if it was not yet."""
    _lib.load()
    return _lib.path()


def __getattr__(name):
    # Client and Future live in _client, which is imported on first use so that `import convd`
    # stays cheap and does not need the library.
    if name in ("Client", "Future"):
        from convd import _client

        return getattr(_client, name)
    raise AttributeError(f"module 'convd' has no attribute {name!r}")

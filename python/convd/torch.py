"""PyTorch integration: convd.torch.Conv2d and convd.torch.patch.

    import convd, convd.torch
    client = convd.connect()
    model = convd.torch.patch(torchvision.models.resnext50_32x4d(), client).eval()
    with torch.no_grad():
        y = model(x)

This module imports torch (it is the torch integration); the rest of the package does not. The
absolute imports below reach the real torch, never this module.

The patched modules compute the forward pass only: their outputs carry no autograd history, so
use them for inference (under torch.no_grad() or torch.inference_mode(), or not).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from convd import _lib
from convd._args import activation_spec
from convd._client import Placed, channels_last
from convd._errors import invalid

__all__ = ["Conv2d", "patch", "can_serve"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _version(t) -> int:
    """The tensor's version counter, which in-place changes bump; -1 for an inference tensor
    (made under torch.inference_mode()), which has none: a change to one in place is seen only
    through convd_refresh()."""
    # Asking an inference tensor for its version raises, which costs half a millisecond.
    return -1 if t.is_inference() else t._version


_ACT_NAMES = {
    _lib.ACT_RELU: "relu",
    _lib.ACT_SILU: "silu",
    _lib.ACT_HARDSWISH: "hardswish",
    _lib.ACT_GELU: "gelu",
    _lib.ACT_GELU_TANH: "gelu_tanh",
}


def _torch_act(y, spec):
    """The activation of an activation_spec() with PyTorch's functions, for a module that
    computes with PyTorch (no client)."""
    act, lo, hi = spec
    F = torch.nn.functional
    if act == _lib.ACT_NONE:
        return y
    if act == _lib.ACT_RELU:
        return F.relu(y)
    if act == _lib.ACT_CLAMP:
        return torch.clamp(y, lo, hi)
    if act == _lib.ACT_SILU:
        return F.silu(y)
    if act == _lib.ACT_HARDSWISH:
        return F.hardswish(y)
    return F.gelu(y, approximate="tanh" if act == _lib.ACT_GELU_TANH else "none")


def can_serve(conv: nn.Module) -> bool:
    """Whether convd can compute this module's convolutions: a plain torch.nn.Conv2d (not a
    subclass with its own forward) with zero padding, its parameters in fp32, fp16 or bf16 on the
    CPU or a CUDA device."""
    if not isinstance(conv, nn.Conv2d):
        return False
    if type(conv) is not nn.Conv2d and not isinstance(conv, Conv2d):
        return False
    if conv.padding_mode != "zeros":
        return False
    w = conv.weight
    if w is None or w.dim() != 4 or w.dtype not in _DTYPES or w.device.type not in ("cpu", "cuda"):
        return False
    b = conv.bias
    return b is None or (b.dtype == w.dtype and b.device == w.device)


class Conv2d(nn.Conv2d):
    """torch.nn.Conv2d computed by the convd daemon.

    Takes nn.Conv2d's arguments plus ``client`` (a convd.Client; None computes with PyTorch) and
    ``activation`` (fused after the bias, as in Client.conv2d(): 'relu', 'relu6', 'silu',
    'hardswish', 'gelu', 'gelu_tanh' or ('clamp', lo, hi); ``relu=True`` is 'relu'). fp32 on
    CUDA multiplies in TF32 when torch.backends.cudnn.allow_tf32 says so, as nn.Conv2d does. The parameters are the module's own, trained and saved
    as usual. On the CPU the weight (and bias) is copied once into memory the daemon has mapped
    and kept there; it is copied again only when it changes (a new tensor, or an in-place update,
    which bumps the tensor's version). CUDA weights are used in place; for channels_last input
    a channels_last copy of the weight is made once and kept the same way.
    """

    def __init__(self, *args, client=None, relu: bool = False, activation=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.convd_client = client
        self.convd_act = activation_spec(relu, activation)
        self._convd_held = None
        self._convd_held_key = None
        self._convd_cl = None
        self._convd_cl_key = None
        self._convd_fast = None

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, client) -> "Conv2d":
        """A Conv2d that shares conv's parameters (the same Parameter objects), hooks and mode."""
        m = cls.__new__(cls)
        m.__dict__.update(conv.__dict__)
        m._parameters = conv._parameters
        m._buffers = conv._buffers
        m._modules = conv._modules
        m.convd_client = client
        m.convd_act = activation_spec(False, None)
        m._convd_held = None
        m._convd_held_key = None
        m._convd_cl = None
        m._convd_cl_key = None
        m._convd_fast = None
        return m

    def extra_repr(self) -> str:
        s = super().extra_repr()
        act, lo, hi = self.convd_act
        if act == _lib.ACT_CLAMP:
            s += f", activation=('clamp', {lo}, {hi})"
        elif act != _lib.ACT_NONE:
            s += f", activation={_ACT_NAMES[act]!r}"
        return s + (", convd" if self.convd_client is not None else "")

    def __getstate__(self):
        # A client (a connection) cannot be pickled or deep-copied; the copy computes with
        # PyTorch until it is given one.
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        state = dict(state)
        state["convd_client"] = None
        state["_convd_held"] = None
        state["_convd_held_key"] = None
        state["_convd_cl"] = None
        state["_convd_cl_key"] = None
        state["_convd_fast"] = None
        return state

    def convd_refresh(self) -> None:
        """Copies the weight again at the next call. Needed only after changing it in a way
        PyTorch does not count as a change to the tensor: through ``.data`` (``w.data.mul_(2)``),
        through memory shared with numpy, or in place on an inference tensor."""
        self._convd_held_key = None
        self._convd_cl_key = None
        self._convd_fast = None

    def _convd_weights_cpu(self, client, nhwc: bool):
        w, b = self.weight, self.bias
        key = (
            client,
            id(w),
            w.data_ptr(),
            _version(w),
            w.dtype,
            None if b is None else (id(b), b.data_ptr(), _version(b)),
            nhwc,
        )
        if key != self._convd_held_key:
            old = self._convd_held
            if old is not None and old.client is not client:
                old.release()
                old = None
            self._convd_held = client._hold(w, b, nhwc, old)
            self._convd_held_key = key
        return self._convd_held

    def _convd_weight_cl(self):
        w = self.weight
        if w.is_contiguous(memory_format=torch.channels_last):
            return w.detach()
        key = (id(w), w.data_ptr(), _version(w))
        if key != self._convd_cl_key:
            self._convd_cl = w.detach().contiguous(memory_format=torch.channels_last)
            self._convd_cl_key = key
        return self._convd_cl

    def forward(self, input):
        client = self.convd_client
        if client is None or self.padding_mode != "zeros":
            return _torch_act(super().forward(input), self.convd_act)
        if not isinstance(input, torch.Tensor):
            raise invalid(f"Conv2d takes a torch tensor, not {type(input).__name__}")
        if input.is_cuda:
            fast = self._convd_fast
            if fast is not None and fast.matches(self, client, input):
                y = client._layer_cuda(fast, input)
                if y is not None:
                    return y
        nhwc = channels_last(input)
        args = (self.stride, self.padding, self.dilation, self.groups, self.convd_act, None)
        layout = "nhwc" if nhwc else "nchw"
        if input.is_cuda:
            w = self._convd_weight_cl() if nhwc else self.weight.detach()
            b = self.bias.detach() if self.bias is not None else None
            y = client._call(input.detach(), w, b, *args, layout, 0, True)
            self._convd_fast = _LayerFast.make(self, client, input, w, b, nhwc)
            return y
        held = self._convd_weights_cpu(client, nhwc)
        marker = True if self.bias is not None else None
        # Straight to the torch path (the input is known to be a tensor): this runs once per
        # convolution of every forward pass. No detach(): only the data pointers are read.
        if client._dead:
            client._reap_locked()
        return client._call_torch(input, held, marker, *args, layout, 0, True)

    def __del__(self):
        held = self.__dict__.get("_convd_held")
        if held is not None:
            try:
                held.release()
            except Exception:
                pass


class _LayerFast:
    """What a patched layer's next call on a CUDA input of the same signature can skip (issue
    time is CPU time: 85 of these calls make a regnet_y_400mf forward pass): the plan lookup by
    a key of every argument, the weight's and bias's processing, and the driver's answer to
    where they live. Made after a stream-ordered call whose weight is used in place; any
    difference in the layer (its arguments, its parameters' objects or storage) or the input
    (shape, dtype, device, layout, contiguity) sends the call the general way."""

    __slots__ = ("client", "shape", "dtype", "device", "fmt", "args", "weight", "bias",
                 "wshape", "w", "b", "plan", "tf32")

    @staticmethod
    def layer_args(m) -> tuple:
        """What of the layer besides its parameters decides its plan."""
        return (m.stride, m.padding, m.dilation, m.groups, m.convd_act, m.padding_mode)

    @classmethod
    def make(cls, m, client, x, w, b, nhwc: bool):
        if not client._ordered or client._gates is None or x.dim() != 4:
            return None
        n, c, h, wd = x.shape
        if c == 1 or h * wd == 1:
            return None  # both layouts' contiguity at once: channels_last() reads the strides
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        weight, bias = m.weight, m.bias
        if (
            not x.is_contiguous(memory_format=fmt)
            or w.data_ptr() != weight.data_ptr()
            or not weight.is_contiguous(memory_format=fmt)
            or (bias is not None and not bias.is_contiguous())
        ):
            return None  # the general path copies the input or the weight for each call
        f = cls()
        f.client = client
        f.shape, f.dtype, f.device, f.fmt = x.shape, x.dtype, x.device, fmt
        f.args = cls.layer_args(m)
        f.weight, f.bias, f.wshape = weight, bias, weight.shape
        f.w = Placed(w)
        f.b = Placed(b) if b is not None else None
        f.tf32 = bool(torch.backends.cudnn.allow_tf32)
        f.plan = client._torch_plan_for(
            x, w, b, False, nhwc, m.stride, m.padding, m.dilation, m.groups, m.convd_act, None,
            None,
        )
        return f

    def matches(self, m, client, x) -> bool:
        if (
            client is not self.client
            or not client._ordered
            or x.shape != self.shape
            or x.dtype != self.dtype
            or x.device != self.device
            or not x.is_contiguous(memory_format=self.fmt)
        ):
            return False
        weight, bias = m.weight, m.bias
        if (
            weight is not self.weight
            or weight.data_ptr() != self.w.ptr
            or weight.shape != self.wshape
            or not weight.is_contiguous(memory_format=self.fmt)
        ):
            return False
        if bias is not self.bias or (bias is not None and bias.data_ptr() != self.b.ptr):
            return False
        if self.layer_args(m) != self.args:
            return False
        return self.dtype != torch.float32 or bool(torch.backends.cudnn.allow_tf32) == self.tf32


def patch(model: nn.Module, client) -> nn.Module:
    """Replaces, in place, every torch.nn.Conv2d of model that convd can serve (can_serve())
    with a convd.torch.Conv2d sharing its parameters, and returns the model. Modules convd
    cannot serve (padding_mode other than 'zeros', other dtypes, subclasses of nn.Conv2d with
    their own forward) stay as they are. Conv2d modules already patched get this client. When
    model itself is an nn.Conv2d, the replacement is returned."""
    if isinstance(model, Conv2d):
        model.convd_client = client
        return model
    if isinstance(model, nn.Conv2d):
        return Conv2d.from_conv(model, client) if can_serve(model) else model
    for name, child in list(model.named_children()):
        if isinstance(child, Conv2d):
            child.convd_client = client
        elif isinstance(child, nn.Conv2d):
            if can_serve(child):
                setattr(model, name, Conv2d.from_conv(child, client))
        else:
            patch(child, client)
    return model

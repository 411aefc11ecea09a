"""Recording a run of C kernel calls and running it again in one call (kernels/csrc/kernel_program.c).

A decode step of a small model is ~270 short C calls with Python between them: at batch 1 of the default
model the Python took ~3 ms of a ~8 ms token, and in its gaps OpenMP's workers went to sleep and had to be
woken for the next call (docs/performance.md, "Decode steps replayed"). A step whose shapes repeat (a decode
batch of the same size) makes the same calls on the same buffers every time, only the values in a few
input tensors differ. So the calls are recorded once and run again from C: CUDA graphs' idea, on the CPU.

- `PackedKernel` wraps a C entry point that takes its arguments packed in one buffer (the `*_packed`
  functions of kernels/csrc); while a `KernelRecorder` listens, each call's function and argument bytes
  are kept, in order.
- `KernelRecorder` also watches torch's functions in the recorded code (a TorchFunctionMode; a
  TorchDispatchMode would import torch._dynamo and sympy, 0.6 s and tens of MiB): a recording is
  only valid if every value was computed by recorded kernels, so any torch op that computes (not a view,
  not an allocation, not a tensor made from Python values) spoils it, as does a C call that is not a
  `PackedKernel` (`note_unrecorded`). Every tensor made while recording is kept alive with the program,
  since the recorded arguments point into them.
- `KernelProgram.run()` calls the recorded kernels again, in one C call, on whatever values the caller
  has written into the recorded inputs.

One recorder at a time, on the thread that runs the model (the engine's).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = ["KernelProgram", "KernelRecorder", "PackedKernel", "bind_runner", "note_unrecorded"]

# torch functions a recording may call (names as TorchFunctionMode sees them): they read metadata, make
# tensors or views, and compute no value
_METADATA = {"getset_descriptor.__get__", "TensorBase.data_ptr", "TensorBase.is_contiguous", "TensorBase.dim",
             "TensorBase.numel", "TensorBase.stride", "TensorBase.size", "TensorBase.element_size"}
_ALLOCATIONS = {"_VariableFunctionsClass.empty", "_VariableFunctionsClass.empty_like", "_VariableFunctionsClass.tensor"}
_VIEWS = {"TensorBase.view", "TensorBase.reshape", "TensorBase.__getitem__", "TensorBase.contiguous"}

_recorder: KernelRecorder | None = None  # the one listening, if any


class PackedKernel:
    """A C function `int64_t f(const int64_t* args)`: returns its status (0: done)."""

    __slots__ = ("function", "address")

    def __init__(self, function):
        function.argtypes = [ctypes.c_char_p]
        function.restype = ctypes.c_int64
        self.function = function
        self.address = ctypes.cast(function, ctypes.c_void_p).value

    def __call__(self, args: bytes) -> int:
        status = self.function(args)
        if _recorder is not None:
            _recorder.add(self.address, args, status)
        return status


def note_unrecorded(kernel: str) -> None:
    """A C call a recording cannot hold (not a PackedKernel): spoils the recording listening, if any."""
    if _recorder is not None:
        _recorder.spoil(f"{kernel} is not a recordable kernel")


class KernelRecorder(TorchFunctionMode):
    """`with KernelRecorder(runner) as recorder:` run the code once; then `recorder.program()` is the
    recording, or None with `recorder.spoiled` saying why."""

    def __init__(self, runner: ctypes._CFuncPtr):
        super().__init__()
        self._runner = runner  # run_kernel_program of kernels/csrc/kernel_program.c
        self._kernels: list[int] = []
        self._args: list[bytes] = []
        self._made: list[Tensor] = []  # every tensor made while recording (the arguments point into them)
        self.spoiled: str | None = None

    def add(self, address: int, args: bytes, status: int) -> None:
        if status:
            self.spoil(f"a kernel returned {status}")
        self._kernels.append(address)
        self._args.append(args)

    def spoil(self, reason: str) -> None:
        self.spoiled = self.spoiled or reason

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__qualname__", repr(func))
        if name in _ALLOCATIONS:
            self._made.append(out)
        elif name in _VIEWS:
            if out.untyped_storage().data_ptr() != args[0].untyped_storage().data_ptr():
                self.spoil(f"{name} copied")  # a reshape, index or contiguous that is not a view
            self._made.append(out)
        elif name not in _METADATA:
            self.spoil(f"torch's {name} computes outside the recorded kernels")
        return out

    def __enter__(self):
        global _recorder
        if _recorder is not None:
            raise RuntimeError("a kernel recording is already running")
        _recorder = self
        return super().__enter__()

    def __exit__(self, *exc):
        global _recorder
        _recorder = None
        return super().__exit__(*exc)

    def program(self, keep: tuple = ()) -> KernelProgram | None:
        """The recording (holding `keep` too: the inputs the caller refreshes), or None if spoiled or empty."""
        if self.spoiled is not None or not self._kernels:
            self.spoiled = self.spoiled or "no kernel was called"
            return None
        return KernelProgram(self._runner, self._kernels, self._args, (*self._made, *keep))


class KernelProgram:
    def __init__(self, runner, kernels: list[int], args: list[bytes], keep: tuple):
        self._runner = runner
        self._args = args  # the argument bytes live as long as the program
        self._keep = keep
        self.num_calls = len(kernels)
        self._kernel_table = (ctypes.c_int64 * len(kernels))(*kernels)
        self._arg_table = (ctypes.c_int64 * len(args))(
            *(ctypes.cast(ctypes.c_char_p(a), ctypes.c_void_p).value for a in args))
        self._status = ctypes.c_int64(0)

    def run(self) -> None:
        failed = self._runner(self.num_calls, self._kernel_table, self._arg_table, ctypes.byref(self._status))
        if failed:
            raise RuntimeError(f"recorded kernel {failed - 1} of {self.num_calls} returned {self._status.value}")


def bind_runner(library: ctypes.CDLL):
    """run_kernel_program of a library built with kernels/csrc/kernel_program.c."""
    runner = library.run_kernel_program
    runner.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    runner.restype = ctypes.c_int64
    return runner
